//! `--hide`: directories that actions must not see. Each action runs in its own mount namespace
//! in which every hidden directory is covered by an empty read-only tmpfs, so that an absolute
//! path leaking from the client fails as it would on a real cluster. Namespaces are probed once at
//! start-up: where they are unavailable, `--hide` is an error rather than silently ignored.

use anyhow::{Context as _, bail};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The directories to hide, as C strings prepared before any fork.
#[derive(Clone, Default)]
pub struct Isolation {
    hidden: Arc<[CString]>,
    /// Without root, the mount namespace comes with a user namespace that maps the server's user
    /// to root inside it: `(uid_map, gid_map)` contents, prepared before any fork.
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

/// Runs in the forked child before exec: only async-signal-safe calls, no allocation.
fn cover(hidden: &[CString], user_maps: Option<&(CString, CString)>) -> std::io::Result<()> {
    let fail = || Err(std::io::Error::last_os_error());
    // SAFETY: plain system calls on NUL-terminated strings that outlive the calls.
    unsafe {
        match user_maps {
            None => {
                if libc::unshare(libc::CLONE_NEWNS) != 0 {
                    return fail();
                }
            }
            Some((uid_map, gid_map)) => {
                if libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) != 0 {
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
        }
        // Make every mount private first, so that the tmpfs mounts never propagate to the host.
        let root = c"/";
        if libc::mount(
            std::ptr::null(),
            root.as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
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
        // SAFETY: getuid/getgid/geteuid cannot fail.
        let (uid, gid, euid) = unsafe { (libc::getuid(), libc::getgid(), libc::geteuid()) };
        let user_maps = (euid != 0).then(|| {
            let map = |id: u32| CString::new(format!("0 {id} 1")).unwrap_or_default();
            Arc::new((map(uid), map(gid)))
        });
        let isolation = Self {
            hidden: hidden.into(),
            user_maps,
        };
        if !isolation.hidden.is_empty() {
            isolation.probe()?;
        }
        Ok(isolation)
    }

    /// Runs `/bin/sh -c 'exit 0'` under the same isolation an action gets.
    fn probe(&self) -> anyhow::Result<()> {
        let mut probe = std::process::Command::new("/bin/sh");
        probe.args(["-c", "exit 0"]);
        let (hidden, user_maps) = (self.hidden.clone(), self.user_maps.clone());
        // SAFETY: `cover` only makes system calls, as a pre_exec hook must.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut probe, move || {
                cover(&hidden, user_maps.as_deref())
            });
        }
        let status = probe.status().context(
            "--hide needs a private mount namespace per action (unshare(CLONE_NEWNS) and mount as \
             root, or inside an unprivileged user namespace otherwise), which this system refused",
        )?;
        if !status.success() {
            bail!("--hide: the isolation probe exited with {status}");
        }
        Ok(())
    }

    /// Makes `command` run with the hidden directories covered.
    pub fn apply(&self, command: &mut tokio::process::Command) {
        if self.hidden.is_empty() {
            return;
        }
        let (hidden, user_maps) = (self.hidden.clone(), self.user_maps.clone());
        // SAFETY: `cover` only makes system calls, as a pre_exec hook must.
        unsafe {
            command.pre_exec(move || cover(&hidden, user_maps.as_deref()));
        }
    }
}
