//! An action's directory under the work root, which must go away whatever the action did to it:
//! an action may leave directories it made unreadable or unwritable, which a plain recursive
//! removal (as the server's user, not root) cannot enter. Removal makes every directory it meets
//! accessible again first, and runs when the directory is dropped, on every path out of a run.
//!
//! When actions run as ids of their own (the server is root), the action gets the directories of
//! its input root, and nothing else: its files stay the server's, read-only to it.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use tonic::Status;

/// A fresh directory for one action; removed when dropped.
pub struct ActionDir {
    path: PathBuf,
}

impl ActionDir {
    /// A new `action-*` directory in `work_root`, searchable (not readable) by others, so that an
    /// action running as another uid can reach its own `root` inside it but list nothing.
    pub fn create(work_root: &Path) -> Result<ActionDir, Status> {
        let dir = tempfile::Builder::new()
            .prefix("action-")
            .permissions(std::fs::Permissions::from_mode(0o711))
            .tempdir_in(work_root)
            .map_err(|e| Status::internal(format!("cannot create an action directory: {e}")))?;
        Ok(ActionDir { path: dir.keep() })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the directory now (blocking), before the action's ids go to another action.
    pub fn remove(mut self) -> Result<(), Status> {
        let path = std::mem::take(&mut self.path);
        remove_all(&path).map_err(|e| {
            Status::internal(format!(
                "cannot remove the action directory {}: {e}",
                path.display()
            ))
        })
    }
}

impl Drop for ActionDir {
    /// On the way out of a failed run: removal in the background.
    fn drop(&mut self) {
        let path = std::mem::take(&mut self.path);
        if path.as_os_str().is_empty() {
            return;
        }
        let remove = move || {
            if let Err(e) = remove_all(&path) {
                eprintln!(
                    "dtlto-reapi serve: cannot remove the action directory {}: {e}",
                    path.display()
                );
            }
        };
        // Removal blocks: off the async threads when there are some.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(remove)),
            Err(_) => remove(),
        }
    }
}

/// Removes `path` and everything below it, first giving the server's user access to every
/// directory (an action may have made one unreadable or unwritable).
pub fn remove_all(path: &Path) -> std::io::Result<()> {
    if std::fs::remove_dir_all(path).is_ok() || !path.exists() {
        return Ok(());
    }
    open_up(path);
    std::fs::remove_dir_all(path)
}

/// Makes every directory at and below `dir` readable, writable and searchable by its owner,
/// without following symlinks; best effort (what it cannot fix, the removal reports).
fn open_up(dir: &Path) {
    let Ok(meta) = std::fs::symlink_metadata(dir) else {
        return;
    };
    if !meta.is_dir() {
        return;
    }
    let _ = std::fs::set_permissions(
        dir,
        std::fs::Permissions::from_mode(meta.permissions().mode() | 0o700),
    );
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            open_up(&entry.path());
        }
    }
}

/// Gives `root` and every directory below it to the uid and gid `id` (mode 0700), so that an
/// action running as `id` can create its outputs there and no other action can look in; files
/// stay the server's. Nothing is followed: the tree is the input root this server just wrote.
pub fn give_directories(root: &Path, id: u32) -> Result<(), Status> {
    let fail = |path: &Path, e: std::io::Error| {
        Status::internal(format!(
            "cannot give {} to the action's user: {e}",
            path.display()
        ))
    };
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        std::os::unix::fs::lchown(&dir, Some(id), Some(id)).map_err(|e| fail(&dir, e))?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| fail(&dir, e))?;
        for entry in std::fs::read_dir(&dir).map_err(|e| fail(&dir, e))? {
            let entry = entry.map_err(|e| fail(&dir, e))?;
            if entry.file_type().map_err(|e| fail(&dir, e))?.is_dir() {
                pending.push(entry.path());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removes_directories_an_action_locked() {
        let work = tempfile::tempdir().unwrap();
        let dir = ActionDir::create(work.path()).unwrap();
        let locked = dir.path().join("root/a/b");
        std::fs::create_dir_all(&locked).unwrap();
        std::fs::write(locked.join("f"), b"x").unwrap();
        for d in [&locked, &dir.path().join("root/a")] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o000)).unwrap();
        }
        let path = dir.path().to_path_buf();
        drop(dir);
        assert!(!path.exists(), "{} is still there", path.display());
    }
}
