//! The Unix side of [`crate::platform`]: the POSIX calls behind each function.

use std::ffi::OsStr;
use std::fs::{DirBuilder, File, Metadata, OpenOptions};
use std::io;
use std::os::unix::fs::{
    DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _,
};
use std::path::{Path, PathBuf};

use super::Stamp;

// --- Programs -----------------------------------------------------------------------------------

/// Whether `path` names a file by its path (it has a `/`) rather than a program to look up.
pub fn names_a_path(path: &OsStr) -> bool {
    path.as_encoded_bytes().contains(&b'/')
}

/// Whether the file's mode lets anyone execute it (what REAPI's `is_executable` records).
pub fn executable_bit(meta: &Metadata) -> bool {
    meta.permissions().mode() & 0o111 != 0
}

/// `dir/name` when it is an executable file.
pub(super) fn program_candidates(dir: &Path, name: &OsStr) -> Option<PathBuf> {
    let candidate = dir.join(name);
    candidate
        .metadata()
        .is_ok_and(|m| m.is_file() && executable_bit(&m))
        .then_some(candidate)
}

// --- Files of the caches ------------------------------------------------------------------------

/// The identity and times of the file `meta` describes.
pub fn stamp_of(meta: &Metadata) -> Stamp {
    Stamp {
        device: meta.dev(),
        inode: meta.ino(),
        mtime_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
        ctime_ns: meta.ctime() * 1_000_000_000 + meta.ctime_nsec(),
    }
}

/// The stamp and metadata of the file at `path` (symlinks followed): one `stat`.
pub fn stamp_path(path: &Path) -> io::Result<(Stamp, Metadata)> {
    let meta = std::fs::metadata(path)?;
    Ok((stamp_of(&meta), meta))
}

/// The stamp and metadata of an open file.
pub fn stamp_file(file: &File) -> io::Result<(Stamp, Metadata)> {
    let meta = file.metadata()?;
    Ok((stamp_of(&meta), meta))
}

/// A builder of directories private to this user (mode 0700).
pub fn private_dirs() -> DirBuilder {
    let mut builder = DirBuilder::new();
    builder.mode(0o700);
    builder
}

/// Makes files that `options` creates private to this user (mode 0600).
pub fn private_file(options: &mut OpenOptions) -> &mut OpenOptions {
    options.mode(0o600)
}

/// Opens `path` with `options`, failing (`ELOOP`) instead of following a symlink.
pub fn open_no_follow(options: &mut OpenOptions, path: &Path) -> io::Result<File> {
    options.custom_flags(libc::O_NOFOLLOW).open(path)
}

/// Why the cache file or directory at `path`, with metadata `meta`, could have been written by
/// another user, if so: it belongs to another user, or group or others may write it.
pub fn foreign_writable(_path: &Path, meta: &Metadata) -> Option<String> {
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        Some(format!(
            "is owned by user {}, not by this user ({me})",
            meta.uid()
        ))
    } else if meta.mode() & 0o022 != 0 {
        Some(format!(
            "is writable by group or others (mode {:o})",
            meta.mode() & 0o7777
        ))
    } else {
        None
    }
}

// --- This process and others --------------------------------------------------------------------

/// The CPU time this process has used so far, user and system; not its children's.
pub fn own_cpu() -> std::time::Duration {
    use std::time::Duration;
    // SAFETY: getrusage only writes the struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut usage) != 0 {
            return Duration::ZERO;
        }
        usage
    };
    let time = |t: libc::timeval| {
        Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
            + Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// Whether process `pid` exists (as kill(2) sees it: one of another user's counts too).
pub fn is_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks whether the target exists.
    let found = unsafe { libc::kill(pid, 0) } == 0;
    found || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

// --- Interrupts ---------------------------------------------------------------------------------

/// The interrupts that cancel a run: SIGINT, SIGTERM and SIGHUP (a closed terminal).
pub struct Interrupts {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

/// The number of the interrupt a user repeats when impatient (SIGINT).
pub const INTERRUPT: i32 = libc::SIGINT;

impl Interrupts {
    /// Installs the handlers; must be called within a runtime.
    pub fn new() -> io::Result<Interrupts> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Interrupts {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }

    /// The next interrupt, as its signal number.
    pub async fn next(&mut self) -> i32 {
        tokio::select! {
            _ = self.interrupt.recv() => libc::SIGINT,
            _ = self.terminate.recv() => libc::SIGTERM,
            _ = self.hangup.recv() => libc::SIGHUP,
        }
    }

    /// The next SIGINT.
    pub async fn next_interrupt(&mut self) {
        self.interrupt.recv().await;
    }
}

/// How an interrupt's number reads in a message: `signal 2`.
pub fn describe_interrupt(number: i32) -> String {
    format!("signal {number}")
}

// --- Process trees ------------------------------------------------------------------------------

/// A started program and everything it starts: a process group of its own, which it leads.
pub struct ProcessTree {
    group: libc::pid_t,
}

impl ProcessTree {
    /// Prepares `command` to lead a process group of its own.
    pub fn prepare(command: &mut tokio::process::Command) {
        command.process_group(0);
    }

    /// The group of the started `child`.
    pub fn adopt(child: &mut tokio::process::Child) -> io::Result<ProcessTree> {
        let group = child
            .id()
            .and_then(|id| libc::pid_t::try_from(id).ok())
            .ok_or_else(|| io::Error::other("the child has already exited"))?;
        Ok(ProcessTree { group })
    }

    /// The process group's id, for the reaper.
    pub fn id(&self) -> u32 {
        self.group.unsigned_abs()
    }

    /// SIGTERM to the group, so that clang removes its own temporary files.
    pub fn request_end(&self) {
        // SAFETY: kill(2) on the process group led by a child we spawned; the group id stays
        // reserved while any member of the group lives, so it cannot name anyone else's processes.
        unsafe { libc::kill(-self.group, libc::SIGTERM) };
    }

    /// Lets what is left of the tree outlive this value (a group needs nothing for that).
    pub fn release(self) {}

    /// SIGKILL to whatever is left of the group (even when the leader has exited, processes it
    /// started may remain); ESRCH, when nothing is left, is harmless.
    pub fn kill(&self) {
        // SAFETY: as for `request_end`.
        unsafe { libc::kill(-self.group, libc::SIGKILL) };
    }
}

/// This machine's name, for the worker field of results it stores.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map_or_else(|_| "unknown host".to_owned(), |h| h.trim().to_owned())
}

/// Bytes read from a file (a response file, an ELF header, the digest cache) as an OS string:
/// any bytes are one on Unix.
pub fn os_string_from_bytes(bytes: Vec<u8>) -> std::ffi::OsString {
    std::os::unix::ffi::OsStringExt::from_vec(bytes)
}

/// The file that reads as empty and swallows writes.
pub const NULL_DEVICE: &str = "/dev/null";

/// Replaces this process with `command` (`exec`): its exit status, or the signal that ends it, is
/// this process's. Returns only the error that kept it from starting.
pub fn run_in_place(mut command: std::process::Command) -> io::Error {
    use std::os::unix::process::CommandExt as _;
    command.exec()
}
