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

// --- CPU time slices ----------------------------------------------------------------------------

/// The CPU time slice a compile asks for: over five times the kernel's default, which is 0.7 ms
/// times 1 + log2 of the cores (counting at most 8): 1.4 ms on 2 cores, at most 2.8 ms.
#[cfg(target_os = "linux")]
const COMPILE_TIME_SLICE_NS: u64 = 15_000_000;

/// Asks the kernel for a long CPU time slice for the calling process, a compile about to exec (two
/// system calls, fit for a `pre_exec` hook; kernels before Linux 6.12, which have no slice per
/// task, ignore it, and a failure changes nothing).
///
/// Why: under the kernel's EEVDF scheduler, a thread woken on a core busy with a compile waits for
/// the compile's slice to end, up to a timer tick (4 ms measured, for `serve` answering an RPC
/// beside a running action), unless the woken thread's slice is shorter than the compile's. With
/// this, the threads that steer compiles (`serve` answering RPCs, the distributor taking a result)
/// get the core as soon as they wake. The compile keeps its share of the CPU, and is switched out
/// less often.
pub fn ask_for_long_time_slice() {
    #[cfg(target_os = "linux")]
    // SAFETY: sched_getattr(2) and sched_setattr(2) on the calling process, with an attribute block
    // of the size given; nothing else is touched.
    unsafe {
        let mut attr: libc::sched_attr = std::mem::zeroed();
        let size = std::mem::size_of::<libc::sched_attr>() as u32;
        // The process's own policy and nice value are kept: only the slice changes, and only for
        // the normal policies (a real-time or idle one is the user's choice).
        if libc::syscall(libc::SYS_sched_getattr, 0, &raw mut attr, size, 0) != 0
            || !matches!(
                attr.sched_policy as i32,
                libc::SCHED_OTHER | libc::SCHED_BATCH
            )
        {
            return;
        }
        attr.size = size;
        attr.sched_runtime = COMPILE_TIME_SLICE_NS;
        libc::syscall(libc::SYS_sched_setattr, 0, &raw const attr, 0);
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt as _;

    /// The kernel's (major, minor) version.
    fn kernel_version() -> (u32, u32) {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        let mut parts = release
            .trim()
            .split(['.', '-'])
            .map(|p| p.parse().unwrap_or(0));
        (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
    }

    #[test]
    fn a_compile_gets_a_long_time_slice_and_keeps_its_nice_value() {
        let mut command = std::process::Command::new("sleep");
        command.arg("30");
        // SAFETY: nice(2) and the function under test make only system calls.
        unsafe {
            command.pre_exec(|| {
                libc::nice(5);
                ask_for_long_time_slice();
                Ok(())
            });
        }
        let mut child = command.spawn().unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        // SAFETY: sched_getattr(2) into a block of the size given.
        let (read, attr) = unsafe {
            let mut attr: libc::sched_attr = std::mem::zeroed();
            let size = std::mem::size_of::<libc::sched_attr>() as u32;
            let read = libc::syscall(libc::SYS_sched_getattr, pid, &raw mut attr, size, 0);
            (read, attr)
        };
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(read, 0, "sched_getattr: {}", io::Error::last_os_error());
        assert_eq!(attr.sched_policy, libc::SCHED_OTHER as u32);
        assert_eq!(attr.sched_nice, 5, "the nice value is kept");
        // Linux 6.12 brought a time slice per task, and reports it as the runtime.
        if kernel_version() >= (6, 12) {
            assert_eq!(attr.sched_runtime, COMPILE_TIME_SLICE_NS);
        }
    }
}
