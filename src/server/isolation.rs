//! Action isolation. Every action runs in a PID namespace of its own, in which it is process 1 with
//! a `/proc` of its own (it cannot see the server's or the client's processes, nor reach their
//! files through `/proc/<pid>/cwd`), and in a private mount namespace in which every `--hide`
//! directory is covered by an empty read-only tmpfs, so that an absolute path leaking from the
//! client fails as it would on a real cluster. Who the action is depends on who the server is:
//!
//! - **root**: the namespaces are made as root, then the action drops to an unprivileged uid and
//!   gid of its own (one per worker slot, no supplementary groups, `no_new_privs`): it has no
//!   privilege over any file it does not own, root's files in particular, so it cannot write the
//!   read-only inputs other actions share ([`super::shared_files`]);
//! - **any other user**: a user namespace maps the server's user to root inside it (an unprivileged
//!   process may map only its own ids), so the action has the server's user's rights on files.
//!
//! Timeouts and cancellation kill the action's process 1, which takes every process of its PID
//! namespace with it, whatever sessions or process groups they made. Namespaces are probed once at
//! start-up: where they are unavailable, `--hide` is an error rather than silently ignored, and
//! without `--hide` the server warns and runs actions unisolated.

use anyhow::{Context as _, bail};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};

/// The first of the uids (and gids) actions run as when the server is root: far above the ids
/// distributions hand out to users and to container id ranges (`/etc/subuid` starts at 100000).
pub const FIRST_ACTION_ID: u32 = 1 << 30;

/// Who an action is, and how its namespaces are made.
#[derive(Clone)]
enum Mode {
    /// The system refused namespaces (and nothing is hidden): actions run unisolated.
    Unisolated,
    /// The server is not root: a user namespace maps its user and group (the `uid_map` and
    /// `gid_map` contents) to root inside.
    Mapped(Arc<(CString, CString)>),
    /// The server is root: namespaces made as root, then the action drops to its own ids.
    Dropped,
}

/// A directory that actions running as their own uids may read although a directory above it
/// (root's home) is closed to them (`--readable`): in the action's mount namespace, that directory
/// is covered by a tmpfs in which only the path down to `dir` exists, `dir` mounted there.
struct Readable {
    dir: CString,
    /// The first directory above `dir` that other users cannot search.
    cover: CString,
    /// Whether this entry mounts the cover (the first of those sharing it).
    mounts_cover: bool,
    /// The directories to make in the cover, from below it down to `dir` itself.
    steps: Vec<CString>,
}

/// How actions are isolated; everything prepared before any fork.
#[derive(Clone)]
pub struct Isolation {
    /// The directories to hide, as C strings.
    hidden: Arc<[CString]>,
    /// The `--readable` directories that need a cover (root only).
    readable: Arc<[Readable]>,
    mode: Mode,
}

/// `open_tree(2)` and `move_mount(2)` flags (not all in the libc crate).
const OPEN_TREE_CLONE: libc::c_uint = 1;
const AT_RECURSIVE: libc::c_uint = 0x8000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 4;

/// Makes each readable directory visible under its cover; `trees` has one slot per directory for
/// the detached copies of the directories, taken before any cover hides them. Async-signal-safe.
///
/// # Safety
/// Only system calls on NUL-terminated strings that outlive the call.
unsafe fn uncover(readable: &[Readable], trees: &mut [libc::c_int]) -> bool {
    // SAFETY: as documented above.
    unsafe {
        for (entry, tree) in readable.iter().zip(trees.iter_mut()) {
            let flags = OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | AT_RECURSIVE;
            *tree = libc::syscall(
                libc::SYS_open_tree,
                libc::AT_FDCWD,
                entry.dir.as_ptr(),
                flags,
            ) as libc::c_int;
            if *tree < 0 {
                return false;
            }
        }
        let tmpfs = c"tmpfs";
        for (entry, tree) in readable.iter().zip(trees.iter()) {
            if entry.mounts_cover
                && libc::mount(
                    tmpfs.as_ptr(),
                    entry.cover.as_ptr(),
                    tmpfs.as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV,
                    c"mode=0755".as_ptr().cast(),
                ) != 0
            {
                return false;
            }
            for step in &entry.steps {
                if libc::mkdir(step.as_ptr(), 0o755) != 0
                    && *libc::__errno_location() != libc::EEXIST
                {
                    return false;
                }
            }
            let moved = libc::syscall(
                libc::SYS_move_mount,
                *tree,
                c"".as_ptr(),
                libc::AT_FDCWD,
                entry.dir.as_ptr(),
                MOVE_MOUNT_F_EMPTY_PATH,
            );
            libc::close(*tree);
            if moved != 0 {
                return false;
            }
        }
    }
    true
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

/// Blocks (`how` = `SIG_BLOCK`) or unblocks (`SIG_UNBLOCK`) SIGTERM; async-signal-safe.
fn mask_sigterm(how: libc::c_int) {
    // SAFETY: sigset manipulation on a local set, then sigprocmask.
    unsafe {
        let mut set = std::mem::zeroed::<libc::sigset_t>();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigprocmask(how, &set, std::ptr::null_mut());
    }
}

/// Runs in the forked child before exec: only async-signal-safe calls, no allocation. Enters new
/// mount and PID namespaces (and, for a server that is not root, a user namespace); this process
/// then forks, stays behind to pass on the exit status ([`relay`]), and its child — process 1 of
/// the new PID namespace — mounts its own `/proc`, covers the hidden directories, becomes the
/// action's user and goes on to exec the action.
fn enter(
    hidden: &[CString],
    readable: &[Readable],
    trees: &mut [libc::c_int],
    mode: &Mode,
    ids: (u32, u32),
) -> std::io::Result<()> {
    let fail = || Err(std::io::Error::last_os_error());
    // SAFETY: plain system calls on NUL-terminated strings that outlive the calls.
    unsafe {
        match mode {
            Mode::Unisolated => return Ok(()),
            Mode::Mapped(maps) => {
                let (uid_map, gid_map) = &**maps;
                if libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWPID) != 0
                {
                    return fail();
                }
                // An unprivileged process may map only its own ids, and gid_map only after
                // setgroups is denied.
                if !write_file(c"/proc/self/setgroups", c"deny")
                    || !write_file(c"/proc/self/uid_map", uid_map)
                    || !write_file(c"/proc/self/gid_map", gid_map)
                {
                    return fail();
                }
            }
            Mode::Dropped => {
                // Root's supplementary groups (group 0 among them) must not reach the action.
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWPID) != 0
                {
                    return fail();
                }
            }
        }
        // Until the relay has its SIGTERM handler, a SIGTERM must wait rather than kill it.
        mask_sigterm(libc::SIG_BLOCK);
        match libc::fork() {
            pid if pid < 0 => return fail(),
            0 => {}
            pid => relay(pid),
        }
        mask_sigterm(libc::SIG_UNBLOCK);
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
        if !uncover(readable, trees) {
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
            // A directory under a `--readable` cover may not exist here: then it is hidden already.
            if libc::mount(
                tmpfs.as_ptr(),
                path.as_ptr(),
                tmpfs.as_ptr(),
                flags,
                std::ptr::null(),
            ) != 0
                && *libc::__errno_location() != libc::ENOENT
            {
                return fail();
            }
        }
        if matches!(mode, Mode::Dropped) {
            let (uid, gid) = ids;
            if libc::setresgid(gid, gid, gid) != 0 || libc::setresuid(uid, uid, uid) != 0 {
                return fail();
            }
        }
        // No set-user-ID program or file capability gives the action back any privilege.
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return fail();
        }
        // Should the relay be killed outright (SIGKILL), the action goes with it. Set last: a
        // change of credentials clears it.
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
            return fail();
        }
    }
    Ok(())
}

/// The relay's action (process 1 of the PID namespace), for its SIGTERM handler.
static ACTION: AtomicI32 = AtomicI32::new(0);

/// The relay's SIGTERM handler: kills the action's process 1, and so its whole PID namespace.
extern "C" fn kill_action(_: libc::c_int) {
    let action = ACTION.load(Ordering::Relaxed);
    if action > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe {
            libc::kill(action, libc::SIGKILL);
        }
    }
}

/// The process left outside the action's PID namespace: waits for the action and exits the way it
/// did, so that the server sees the action's own status. SIGTERM makes it kill the action's
/// process 1 — and with it every process of the namespace, whatever sessions or process groups
/// they made — which is how the server stops an action ([`Isolation::stop`]). It closes every
/// inherited descriptor first: the server learns that the action started (or why it could not)
/// from a descriptor that closes on exec, which this process, never exec'ing, must not hold open.
fn relay(action: libc::pid_t) -> ! {
    // SAFETY: async-signal-safe system calls only; `_exit` ends the process without unwinding.
    unsafe {
        libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
        ACTION.store(action, Ordering::Relaxed);
        let mut handler = std::mem::zeroed::<libc::sigaction>();
        handler.sa_sigaction = kill_action as extern "C" fn(libc::c_int) as libc::sighandler_t;
        libc::sigemptyset(&mut handler.sa_mask);
        libc::sigaction(libc::SIGTERM, &handler, std::ptr::null_mut());
        mask_sigterm(libc::SIG_UNBLOCK);
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
    /// Checks the `--hide` directories against the work root and probes for namespaces. `private`
    /// are directories hidden as well when namespaces are available (the server's own state, such
    /// as `--cas-dir`), without making their absence of isolation an error.
    pub fn new(
        hide: &[PathBuf],
        readable: &[PathBuf],
        private: &[PathBuf],
        work_root: &Path,
    ) -> anyhow::Result<Self> {
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
        let required = !hidden.is_empty();
        for path in private {
            if let Ok(canonical) = path.canonicalize()
                && !work_root.starts_with(&canonical)
            {
                hidden.push(CString::new(canonical.as_os_str().as_bytes())?);
            }
        }
        // SAFETY: getuid/getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let map = |id: u32| CString::new(format!("0 {id} 1"));
        let mode = if uid == 0 {
            Mode::Dropped
        } else {
            Mode::Mapped(Arc::new((map(uid)?, map(gid)?)))
        };
        let readable = if matches!(mode, Mode::Dropped) {
            covers(readable, work_root)?
        } else {
            // Actions have the server's user's rights: what it reads, they read.
            Vec::new()
        };
        let mut isolation = Self {
            hidden: hidden.into(),
            readable: readable.into(),
            mode,
        };
        if let Err(e) = isolation.probe() {
            if required {
                return Err(e);
            }
            eprintln!(
                "dtlto-reapi serve: warning: actions run without isolation (they can see this \
                 machine's processes and files): {e:#}"
            );
            isolation.mode = Mode::Unisolated;
            isolation.hidden = Arc::new([]);
            isolation.readable = Arc::new([]);
        }
        Ok(isolation)
    }

    /// Whether actions run as uids of their own (the server is root and namespaces work): then
    /// each action needs its ids ([`FIRST_ACTION_ID`] on) and a directory it owns.
    pub fn own_ids(&self) -> bool {
        matches!(self.mode, Mode::Dropped)
    }

    /// Whether actions have the server's rights on its files (not root, or unisolated): then
    /// inputs must never be shared between actions.
    pub fn actions_are_server_user(&self) -> bool {
        !self.own_ids()
    }

    /// Runs `/bin/sh -c 'exit 0'` under the same isolation an action gets.
    fn probe(&self) -> anyhow::Result<()> {
        let mut probe = std::process::Command::new("/bin/sh");
        probe.args(["-c", "exit 0"]);
        self.apply_std(&mut probe, (FIRST_ACTION_ID, FIRST_ACTION_ID));
        let status = probe.status().context(
            "actions run in PID and mount namespaces of their own (unshare(CLONE_NEWPID | \
             CLONE_NEWNS), and CLONE_NEWUSER unless the server is root) and mount, which this \
             system refused",
        )?;
        if !status.success() {
            bail!("the isolation probe exited with {status}");
        }
        Ok(())
    }

    /// Makes `command` run isolated, as `ids` (uid, gid) when the server is root.
    fn apply_std(&self, command: &mut std::process::Command, ids: (u32, u32)) {
        if matches!(self.mode, Mode::Unisolated) {
            return;
        }
        let hidden = self.hidden.clone();
        let readable = self.readable.clone();
        let mode = self.mode.clone();
        // Allocated here: the hook must not allocate.
        let mut trees = vec![-1; readable.len()];
        // SAFETY: `enter` only makes system calls, as a pre_exec hook must.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(command, move || {
                enter(&hidden, &readable, &mut trees, &mode, ids)
            });
        }
    }

    /// Makes the action `command` run isolated, as `ids` (uid, gid) when the server is root.
    pub fn apply(&self, command: &mut tokio::process::Command, ids: (u32, u32)) {
        self.apply_std(command.as_std_mut(), ids);
    }

    /// Ends what is left of an action whose spawned process (the relay, when isolated) is `pid`:
    /// all of it once `running` (a timeout or a cancellation); when the action has exited, only
    /// unisolated strays need killing (in a PID namespace, the end of process 1 ended them all).
    /// Every process of the action is gone once the spawned process has exited.
    pub fn stop(&self, pid: Option<u32>, running: bool) {
        let Some(pid) = pid.and_then(|pid| i32::try_from(pid).ok()) else {
            return;
        };
        // SAFETY: kill has no memory effects; the process may already be gone (ESRCH), fine.
        unsafe {
            if matches!(self.mode, Mode::Unisolated) {
                // The best there is without a PID namespace: the process group.
                libc::kill(-pid, libc::SIGKILL);
            } else if running {
                libc::kill(pid, libc::SIGTERM);
            }
        }
    }
}

/// The covers `--readable` directories need: for each, the first directory above it that other
/// users cannot search (none, and nothing to do, when every one can be searched).
fn covers(readable: &[PathBuf], work_root: &Path) -> anyhow::Result<Vec<Readable>> {
    use std::os::unix::fs::PermissionsExt;
    let c = |path: &Path| CString::new(path.as_os_str().as_bytes());
    let mut entries: Vec<Readable> = Vec::new();
    for path in readable {
        let dir = path
            .canonicalize()
            .with_context(|| format!("--readable {}: cannot resolve it", path.display()))?;
        if !dir.is_dir() {
            bail!("--readable {}: not a directory", path.display());
        }
        let mut above: Vec<&Path> = dir.ancestors().skip(1).collect();
        above.reverse();
        let closed = above
            .into_iter()
            .find(|a| std::fs::metadata(a).is_ok_and(|m| m.permissions().mode() & 0o001 == 0));
        let Some(cover) = closed else { continue };
        if work_root.starts_with(cover) {
            bail!(
                "--readable {}: actions cannot enter {}, which also holds the action work root {}; \
                 choose another --work-dir",
                path.display(),
                cover.display(),
                work_root.display()
            );
        }
        let mut steps: Vec<CString> = dir
            .ancestors()
            .take_while(|a| *a != cover)
            .map(c)
            .collect::<Result<_, _>>()?;
        steps.reverse();
        let cover = c(cover)?;
        let mounts_cover = !entries.iter().any(|e| e.cover == cover);
        entries.push(Readable {
            dir: c(&dir)?,
            cover,
            mounts_cover,
            steps,
        });
    }
    // Every directory is taken before any cover goes up, so the order does not matter beyond
    // mounting each cover before its steps.
    Ok(entries)
}
