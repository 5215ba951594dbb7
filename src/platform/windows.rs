//! The Windows side of [`crate::platform`]: Job Objects, console control events, file identity by
//! handle, reparse points and owner SIDs, through `windows-sys`.

use std::ffi::{OsStr, OsString, c_void};
use std::fs::{DirBuilder, File, Metadata, OpenOptions};
use std::io;
use std::os::windows::ffi::OsStrExt as _;
use std::os::windows::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::os::windows::io::{AsRawHandle as _, FromRawHandle as _, OwnedHandle, RawHandle};
use std::path::{Path, PathBuf};

use windows_sys::Win32::Foundation::{
    ERROR_INVALID_PARAMETER, FILETIME, GetLastError, HANDLE, INVALID_HANDLE_VALUE, LocalFree,
    STILL_ACTIVE,
};
use windows_sys::Win32::Security::Authorization::{
    ConvertSidToStringSidW, GetNamedSecurityInfoW, SE_FILE_OBJECT,
};
use windows_sys::Win32::Security::{
    EqualSid, GetTokenInformation, OWNER_SECURITY_INFORMATION, PSECURITY_DESCRIPTOR, PSID,
    TOKEN_INFORMATION_CLASS, TOKEN_QUERY, TokenOwner, TokenUser,
};
use windows_sys::Win32::Storage::FileSystem::{
    BY_HANDLE_FILE_INFORMATION, FILE_ATTRIBUTE_REPARSE_POINT, FILE_BASIC_INFO,
    FILE_FLAG_BACKUP_SEMANTICS, FILE_FLAG_OPEN_REPARSE_POINT, FILE_SHARE_DELETE, FILE_SHARE_READ,
    FILE_SHARE_WRITE, FileBasicInfo, GetFileInformationByHandle, GetFileInformationByHandleEx,
};
use windows_sys::Win32::System::Console::SetConsoleCtrlHandler;
use windows_sys::Win32::System::Diagnostics::ToolHelp::{
    CreateToolhelp32Snapshot, TH32CS_SNAPTHREAD, THREADENTRY32, Thread32First, Thread32Next,
};
use windows_sys::Win32::System::JobObjects::{
    AssignProcessToJobObject, CreateJobObjectW, JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE,
    JOBOBJECT_EXTENDED_LIMIT_INFORMATION, JobObjectExtendedLimitInformation,
    SetInformationJobObject, TerminateJobObject,
};
use windows_sys::Win32::System::Threading::{
    CREATE_SUSPENDED, GetCurrentProcess, GetExitCodeProcess, GetProcessTimes, OpenProcess,
    OpenProcessToken, OpenThread, PROCESS_QUERY_LIMITED_INFORMATION, ResumeThread,
    THREAD_SUSPEND_RESUME,
};

use super::Stamp;

/// A handle a call returned, or the error it set (null and `INVALID_HANDLE_VALUE` both fail).
fn owned(handle: HANDLE) -> io::Result<OwnedHandle> {
    if handle.is_null() || handle == INVALID_HANDLE_VALUE {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh handle that nothing else owns.
    Ok(unsafe { OwnedHandle::from_raw_handle(handle as RawHandle) })
}

/// `Ok` when a call returning a BOOL succeeded, else its error.
fn check(ok: i32) -> io::Result<()> {
    if ok == 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A FILETIME-style count (100 ns since 1601) as ns since the Unix epoch.
fn unix_ns(ticks: i64) -> i64 {
    const EPOCH_DIFFERENCE: i64 = 116_444_736_000_000_000;
    ticks.saturating_sub(EPOCH_DIFFERENCE).saturating_mul(100)
}

fn filetime(time: FILETIME) -> u64 {
    (u64::from(time.dwHighDateTime) << 32) | u64::from(time.dwLowDateTime)
}

// --- Programs -----------------------------------------------------------------------------------

/// Whether `path` names a file by its path (a separator or a drive) rather than a program to look up.
pub fn names_a_path(path: &OsStr) -> bool {
    path.as_encoded_bytes()
        .iter()
        .any(|b| matches!(b, b'/' | b'\\' | b':'))
}

/// Windows files have no execute permission: what REAPI's `is_executable` records for a file is
/// decided by its role (the compiler, see `plan::toolchain`), never by its mode.
pub fn executable_bit(_meta: &Metadata) -> bool {
    false
}

/// The files `CreateProcess` would run for `name` in `dir`: `dir\name` when it has an extension,
/// and `dir\name` with each extension of `PATHEXT`.
pub(super) fn program_candidates(dir: &Path, name: &OsStr) -> Vec<PathBuf> {
    let extensions = std::env::var("PATHEXT").unwrap_or_else(|_| ".COM;.EXE;.BAT;.CMD".to_owned());
    let mut names = Vec::new();
    if Path::new(name).extension().is_some() {
        names.push(name.to_owned());
    }
    for extension in extensions.split(';').filter(|e| !e.is_empty()) {
        let mut with = OsString::from(name);
        with.push(extension.to_ascii_lowercase());
        names.push(with);
    }
    names
        .into_iter()
        .map(|name| dir.join(name))
        .filter(|candidate| candidate.is_file())
        .collect()
}

/// The file that reads as empty and swallows writes.
pub const NULL_DEVICE: &str = "NUL";

/// Runs `command` in this process's stead, as far as Windows allows (it has no `exec`): Ctrl-C
/// and Ctrl-Break are left to the command, which shares the console, and this process exits with
/// its exit code. Returns only the error that kept it from starting.
pub fn run_in_place(mut command: std::process::Command) -> io::Error {
    /// Takes every console event as handled, so that this process outlives the command's own
    /// handling of it. (A handler, not `SetConsoleCtrlHandler(NULL, TRUE)`: that would be
    /// inherited, and the command would ignore Ctrl-C too.)
    unsafe extern "system" fn leave_to_the_command(_event: u32) -> i32 {
        1
    }
    // SAFETY: a handler that touches nothing, for the life of the process.
    unsafe { SetConsoleCtrlHandler(Some(leave_to_the_command), 1) };
    match command.status() {
        Ok(status) => std::process::exit(status.code().unwrap_or(1)),
        Err(e) => e,
    }
}

// --- Files of the caches ------------------------------------------------------------------------

/// The stamp of an open handle: volume serial number and file index (`GetFileInformationByHandle`),
/// last write and change times (`FILE_BASIC_INFO`; NTFS keeps a change time like Unix's ctime).
fn stamp_handle(file: &File) -> io::Result<Stamp> {
    let handle = file.as_raw_handle() as HANDLE;
    let mut info: BY_HANDLE_FILE_INFORMATION = unsafe { std::mem::zeroed() };
    // SAFETY: the handle is open for the call; the struct is the one the call writes.
    check(unsafe { GetFileInformationByHandle(handle, &mut info) })?;
    let mut basic = FILE_BASIC_INFO::default();
    // SAFETY: as above, with the buffer's own size.
    let basic_ok = unsafe {
        GetFileInformationByHandleEx(
            handle,
            FileBasicInfo,
            (&raw mut basic).cast::<c_void>(),
            size_of::<FILE_BASIC_INFO>() as u32,
        )
    } != 0;
    let write = unix_ns(filetime(info.ftLastWriteTime) as i64);
    Ok(Stamp {
        device: u64::from(info.dwVolumeSerialNumber),
        inode: (u64::from(info.nFileIndexHigh) << 32) | u64::from(info.nFileIndexLow),
        mtime_ns: write,
        // Without a change time (file systems other than NTFS), the write time stands for it.
        ctime_ns: if basic_ok {
            unix_ns(basic.ChangeTime)
        } else {
            write
        },
    })
}

/// The stamp and metadata of the file at `path` (links followed), through a handle opened for
/// neither reading nor writing, which any sharing mode admits.
pub fn stamp_path(path: &Path) -> io::Result<(Stamp, Metadata)> {
    let file = OpenOptions::new()
        .access_mode(0)
        .share_mode(FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE)
        .custom_flags(FILE_FLAG_BACKUP_SEMANTICS)
        .open(path)?;
    stamp_file(&file)
}

/// The stamp and metadata of an open file.
pub fn stamp_file(file: &File) -> io::Result<(Stamp, Metadata)> {
    Ok((stamp_handle(file)?, file.metadata()?))
}

/// A builder of directories; on Windows they inherit the parent's access list (a user's profile is
/// private to the user).
pub fn private_dirs() -> DirBuilder {
    DirBuilder::new()
}

/// Files inherit their directory's access list on Windows: nothing to add.
pub fn private_file(options: &mut OpenOptions) -> &mut OpenOptions {
    options
}

/// Opens `path` with `options`, failing instead of following a symbolic link, junction or other
/// reparse point: the point itself is opened (`FILE_FLAG_OPEN_REPARSE_POINT`) and refused.
pub fn open_no_follow(options: &mut OpenOptions, path: &Path) -> io::Result<File> {
    let file = options
        .custom_flags(FILE_FLAG_OPEN_REPARSE_POINT)
        .open(path)?;
    if file.metadata()?.file_attributes() & FILE_ATTRIBUTE_REPARSE_POINT != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "is a symbolic link or another reparse point",
        ));
    }
    Ok(file)
}

/// A SID in its string form (`S-1-5-…`), for messages.
fn sid_string(sid: PSID) -> String {
    let mut text = std::ptr::null_mut::<u16>();
    // SAFETY: a valid SID; the string is allocated by the call and freed below.
    if unsafe { ConvertSidToStringSidW(sid, &mut text) } == 0 {
        return "an unknown account".to_owned();
    }
    // SAFETY: a NUL-terminated string the call allocated.
    let string = unsafe {
        let len = (0..).take_while(|&i| *text.add(i) != 0).count();
        String::from_utf16_lossy(std::slice::from_raw_parts(text, len))
    };
    unsafe { LocalFree(text.cast()) };
    string
}

/// The SIDs this process creates files as: its user, and the default owner of what it creates
/// (the Administrators group for an elevated administrator).
fn own_sids() -> io::Result<[Vec<u8>; 2]> {
    let mut token = std::ptr::null_mut();
    // SAFETY: the pseudo-handle of this process; the token handle is owned below.
    check(unsafe { OpenProcessToken(GetCurrentProcess(), TOKEN_QUERY, &mut token) })?;
    let token = owned(token)?;
    let query = |class: TOKEN_INFORMATION_CLASS| -> io::Result<Vec<u8>> {
        let mut buffer = vec![0u8; 256];
        let mut needed = 0;
        // SAFETY: the buffer and its length; the first pointer-sized field of TOKEN_USER and
        // TOKEN_OWNER is the SID, which points into the same buffer.
        unsafe {
            let handle = token.as_raw_handle() as HANDLE;
            let size = buffer.len() as u32;
            if GetTokenInformation(handle, class, buffer.as_mut_ptr().cast(), size, &mut needed)
                == 0
            {
                buffer.resize(needed as usize, 0);
                let size = buffer.len() as u32;
                check(GetTokenInformation(
                    handle,
                    class,
                    buffer.as_mut_ptr().cast(),
                    size,
                    &mut needed,
                ))?;
            }
        }
        Ok(buffer)
    };
    Ok([query(TokenUser)?, query(TokenOwner)?])
}

/// Why the cache file or directory at `path` could have been written by another account, if so:
/// its owner is neither this user nor the default owner of what this user creates. (Access lists
/// are inherited from the user's profile and not inspected.)
pub fn foreign_writable(path: &Path, _meta: &Metadata) -> Option<String> {
    let wide: Vec<u16> = path.as_os_str().encode_wide().chain([0]).collect();
    let mut owner: PSID = std::ptr::null_mut();
    let mut descriptor: PSECURITY_DESCRIPTOR = std::ptr::null_mut();
    // SAFETY: a NUL-terminated path; the descriptor the call allocates is freed below, and the
    // owner SID points into it.
    let error = unsafe {
        GetNamedSecurityInfoW(
            wide.as_ptr(),
            SE_FILE_OBJECT,
            OWNER_SECURITY_INFORMATION,
            &mut owner,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut descriptor,
        )
    };
    if error != 0 {
        return Some(format!(
            "has an owner that cannot be read ({})",
            io::Error::from_raw_os_error(error as i32)
        ));
    }
    let problem = match own_sids() {
        Err(e) => Some(format!("cannot be compared with this user's account ({e})")),
        Ok(mine) => {
            // SAFETY: each buffer starts with a pointer to a SID inside it; `owner` is valid.
            let matches = mine.iter().any(|buffer| unsafe {
                let sid = *buffer.as_ptr().cast::<PSID>();
                EqualSid(sid, owner) != 0
            });
            (!matches).then(|| format!("is owned by {}, not by this user", sid_string(owner)))
        }
    };
    // SAFETY: allocated by GetNamedSecurityInfoW.
    unsafe { LocalFree(descriptor) };
    problem
}

// --- This process and others --------------------------------------------------------------------

/// The CPU time this process has used so far, user and kernel; not its children's.
pub fn own_cpu() -> std::time::Duration {
    let zero = FILETIME {
        dwLowDateTime: 0,
        dwHighDateTime: 0,
    };
    let (mut created, mut exited, mut kernel, mut user) = (zero, zero, zero, zero);
    // SAFETY: the pseudo-handle of this process and four structs the call writes.
    let ok = unsafe {
        GetProcessTimes(
            GetCurrentProcess(),
            &mut created,
            &mut exited,
            &mut kernel,
            &mut user,
        )
    };
    if ok == 0 {
        return std::time::Duration::ZERO;
    }
    std::time::Duration::from_nanos((filetime(kernel) + filetime(user)).saturating_mul(100))
}

/// Whether process `pid` still runs (one this user may not query counts as running).
pub fn is_alive(pid: u32) -> bool {
    // SAFETY: a query-only handle, owned below.
    let handle = unsafe { OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION, 0, pid) };
    let Ok(handle) = owned(handle) else {
        // SAFETY: reads this thread's last error.
        return unsafe { GetLastError() } != ERROR_INVALID_PARAMETER;
    };
    let mut code = 0;
    // SAFETY: the handle is open.
    let ok = unsafe { GetExitCodeProcess(handle.as_raw_handle() as HANDLE, &mut code) };
    ok == 0 || code == STILL_ACTIVE as u32
}

/// This machine's name, for the worker field of results it stores.
pub fn hostname() -> String {
    std::env::var("COMPUTERNAME").unwrap_or_else(|_| "unknown host".to_owned())
}

/// Bytes read from a file (a response file, an ELF header, the digest cache) as an OS string: UTF-8
/// on Windows, anything else replaced (such a path names no file).
pub fn os_string_from_bytes(bytes: Vec<u8>) -> OsString {
    OsString::from(String::from_utf8_lossy(&bytes).into_owned())
}

// --- Process trees ------------------------------------------------------------------------------

/// A started program and everything it starts, in a Job Object that kills them all when its last
/// handle closes (`JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE`): when this value is dropped, or when the
/// distributor dies, however it dies — the Windows answer to process groups and `PR_SET_PDEATHSIG`.
pub struct ProcessTree {
    job: OwnedHandle,
}

impl ProcessTree {
    /// Prepares `command` so that [`adopt`](Self::adopt) puts its process in a job before it runs
    /// a single instruction: it starts suspended.
    pub fn prepare(command: &mut tokio::process::Command) {
        command.creation_flags(CREATE_SUSPENDED);
    }

    /// Puts the suspended `child` into a new job and lets it run. On failure the child is killed:
    /// it never runs outside a job.
    pub fn adopt(child: &mut tokio::process::Child) -> io::Result<ProcessTree> {
        let adopted = child
            .raw_handle()
            .zip(child.id())
            .ok_or_else(|| io::Error::other("the child has already exited"))
            .and_then(|(process, pid)| {
                let tree = ProcessTree::new_job()?;
                // SAFETY: both handles are open.
                check(unsafe {
                    AssignProcessToJobObject(tree.job.as_raw_handle() as HANDLE, process as HANDLE)
                })?;
                resume_threads(pid)?;
                Ok(tree)
            });
        if adopted.is_err() {
            let _ = child.start_kill();
        }
        adopted
    }

    fn new_job() -> io::Result<ProcessTree> {
        // SAFETY: an anonymous job with default security, owned below.
        let job = owned(unsafe { CreateJobObjectW(std::ptr::null(), std::ptr::null()) })?;
        let tree = ProcessTree { job };
        tree.set_limits(JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE)?;
        Ok(tree)
    }

    fn set_limits(&self, flags: u32) -> io::Result<()> {
        let mut limits = JOBOBJECT_EXTENDED_LIMIT_INFORMATION::default();
        limits.BasicLimitInformation.LimitFlags = flags;
        // SAFETY: the struct the information class names, with its size.
        check(unsafe {
            SetInformationJobObject(
                self.job.as_raw_handle() as HANDLE,
                JobObjectExtendedLimitInformation,
                (&raw const limits).cast(),
                size_of::<JOBOBJECT_EXTENDED_LIMIT_INFORMATION>() as u32,
            )
        })
    }

    /// Lets what is left of the tree outlive this value: the job no longer kills on close.
    pub fn release(self) {
        let _ = self.set_limits(0);
    }

    /// Asks the tree to end. Windows has no polite request that reaches console programs without
    /// a console of their own, so this ends them, as [`kill`](Self::kill) does.
    pub fn request_end(&self) {
        self.kill();
    }

    /// Ends every process of the tree at once.
    pub fn kill(&self) {
        // SAFETY: the job handle is open; exit code 1 as for a killed program.
        unsafe { TerminateJobObject(self.job.as_raw_handle() as HANDLE, 1) };
    }
}

/// Resumes the threads of the suspended process `pid` (its main thread, the only one it has).
fn resume_threads(pid: u32) -> io::Result<()> {
    // SAFETY: a snapshot handle, owned below.
    let snapshot = owned(unsafe { CreateToolhelp32Snapshot(TH32CS_SNAPTHREAD, 0) })?;
    let snapshot_handle = snapshot.as_raw_handle() as HANDLE;
    let mut entry = THREADENTRY32 {
        dwSize: size_of::<THREADENTRY32>() as u32,
        ..THREADENTRY32::default()
    };
    let mut resumed = 0;
    // SAFETY: the snapshot is open and `entry` carries its size, as the calls require.
    let mut more = unsafe { Thread32First(snapshot_handle, &mut entry) } != 0;
    while more {
        if entry.th32OwnerProcessID == pid {
            // SAFETY: a thread handle, owned below.
            let thread =
                owned(unsafe { OpenThread(THREAD_SUSPEND_RESUME, 0, entry.th32ThreadID) })?;
            // SAFETY: the thread handle is open.
            if unsafe { ResumeThread(thread.as_raw_handle() as HANDLE) } == u32::MAX {
                return Err(io::Error::last_os_error());
            }
            resumed += 1;
        }
        // SAFETY: as for Thread32First.
        more = unsafe { Thread32Next(snapshot_handle, &mut entry) } != 0;
    }
    if resumed == 0 {
        return Err(io::Error::other(
            "the started process has no thread to resume",
        ));
    }
    Ok(())
}

// --- Interrupts ---------------------------------------------------------------------------------

/// The numbers interrupts get, as the C runtime numbers the signals it makes of console events.
const CTRL_C: i32 = 2;
const CTRL_BREAK: i32 = 21;
const CONSOLE_CLOSED: i32 = 1;

/// The number of the interrupt a user repeats when impatient (Ctrl-C).
pub const INTERRUPT: i32 = CTRL_C;

/// The console events that cancel a run: Ctrl-C, Ctrl-Break and the console closing (what SIGINT,
/// SIGTERM and SIGHUP are on Unix).
pub struct Interrupts {
    ctrl_c: tokio::signal::windows::CtrlC,
    ctrl_break: tokio::signal::windows::CtrlBreak,
    close: tokio::signal::windows::CtrlClose,
}

impl Interrupts {
    /// Installs the handlers; must be called within a runtime.
    pub fn new() -> io::Result<Interrupts> {
        use tokio::signal::windows::{ctrl_break, ctrl_c, ctrl_close};
        Ok(Interrupts {
            ctrl_c: ctrl_c()?,
            ctrl_break: ctrl_break()?,
            close: ctrl_close()?,
        })
    }

    /// The next interrupt, as its number.
    pub async fn next(&mut self) -> i32 {
        tokio::select! {
            _ = self.ctrl_c.recv() => CTRL_C,
            _ = self.ctrl_break.recv() => CTRL_BREAK,
            _ = self.close.recv() => CONSOLE_CLOSED,
        }
    }

    /// The next Ctrl-C.
    pub async fn next_interrupt(&mut self) {
        self.ctrl_c.recv().await;
    }
}

/// How an interrupt's number reads in a message.
pub fn describe_interrupt(number: i32) -> String {
    match number {
        CTRL_C => "Ctrl-C".to_owned(),
        CTRL_BREAK => "Ctrl-Break".to_owned(),
        CONSOLE_CLOSED => "the console closing".to_owned(),
        _ => format!("console event {number}"),
    }
}
