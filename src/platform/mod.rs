//! What differs between the hosts the distributor runs on, Unix (Linux) and Windows, behind one set
//! of small functions, so that the rest of the crate reads the same on both: running programs
//! (finding them on `PATH`, process trees that die with the distributor, interrupts), files of the
//! caches (identity of a file version, no-follow opens, ownership), and this process (CPU time,
//! whether another process lives).
//!
//! `unix.rs` holds the POSIX calls the crate always made; `windows.rs` their Windows equivalents
//! (Job Objects, console control events, volume serial + file index, reparse points, owner SIDs).
//! The `serve` subcommand (`server/`) uses Linux isolation and is not part of the Windows build.

#[cfg(unix)]
mod unix;
#[cfg(unix)]
pub use unix::*;

#[cfg(windows)]
mod windows;
#[cfg(windows)]
pub use windows::*;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// What identifies one version of a file on disk, besides its path and size: the file (device and
/// inode; on Windows volume serial number and file index) and its modification and status-change
/// times in ns since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Stamp {
    pub device: u64,
    pub inode: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

/// The first program `name` in `PATH`'s directories that `accept` takes, as the shell (or, on
/// Windows, `CreateProcess` with `PATHEXT`) would run it.
pub fn find_on_path(name: &OsStr, mut accept: impl FnMut(&Path) -> bool) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .flat_map(|dir| program_candidates(&dir, name))
        .find(|candidate| accept(candidate))
}
