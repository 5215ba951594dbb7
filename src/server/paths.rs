//! Confinement of client-named paths to an action's directory. Paths from a Command (working
//! directory, outputs) are resolved lexically and refused when they climb out; directories are
//! created, and outputs read, only through real directories, never through a symlink that the
//! input tree or the action planted, so nothing outside the action's directory is ever written.

use std::io;
use std::path::{Path, PathBuf};
use tonic::Status;

/// Resolves the relative `path` against the relative, already confined `base`; the result is
/// relative to the action's root. Absolute paths and paths that climb above the root are refused.
pub fn confine(base: &Path, path: &str, what: &str) -> Result<PathBuf, Status> {
    let refuse = |why: &str| Status::invalid_argument(format!("{what} {path:?} {why}"));
    if path.starts_with('/') {
        return Err(refuse("is absolute; it must be relative"));
    }
    if path.contains('\0') {
        return Err(refuse("contains a NUL byte"));
    }
    let mut resolved = base.to_path_buf();
    for segment in path.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                if !resolved.pop() {
                    return Err(refuse("escapes the action's input root"));
                }
            }
            name => resolved.push(name),
        }
    }
    Ok(resolved)
}

/// Creates `root/rel` and every directory above it, refusing to go through anything that is not
/// a real directory (a symlink in particular).
pub fn create_dirs(root: &Path, rel: &Path) -> Result<(), Status> {
    let mut current = root.to_path_buf();
    for component in rel.components() {
        current.push(component);
        match std::fs::symlink_metadata(&current) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(Status::invalid_argument(format!(
                    "{} is in the way of a directory the action needs (it is a file or symlink)",
                    rel.display()
                )));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                std::fs::create_dir(&current).map_err(|e| {
                    Status::internal(format!("cannot create {}: {e}", current.display()))
                })?;
            }
            Err(e) => {
                return Err(Status::internal(format!(
                    "cannot inspect {}: {e}",
                    current.display()
                )));
            }
        }
    }
    Ok(())
}

/// Whether every directory above `root/rel` is a real directory, so that reading `rel` cannot be
/// redirected outside `root`.
pub fn parents_are_real(root: &Path, rel: &Path) -> bool {
    let mut current = root.to_path_buf();
    let Some(parent) = rel.parent() else {
        return true;
    };
    parent.components().all(|component| {
        current.push(component);
        std::fs::symlink_metadata(&current).is_ok_and(|meta| meta.is_dir())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn confines_paths() {
        let base = Path::new("work/sub");
        assert_eq!(
            confine(base, "out/a.o", "p").ok(),
            Some(PathBuf::from("work/sub/out/a.o"))
        );
        assert_eq!(confine(base, "../../x", "p").ok(), Some(PathBuf::from("x")));
        assert!(confine(base, "../../../x", "p").is_err());
        assert!(confine(base, "/etc/passwd", "p").is_err());
        assert_eq!(
            confine(Path::new(""), "./a//b/", "p").ok(),
            Some(PathBuf::from("a/b"))
        );
    }

    #[test]
    fn refuses_to_create_through_symlinks() {
        let root = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        std::os::unix::fs::symlink(outside.path(), root.path().join("link")).expect("symlink");
        assert!(create_dirs(root.path(), Path::new("link/sub")).is_err());
        assert!(!outside.path().join("sub").exists());
        assert!(!parents_are_real(root.path(), Path::new("link/file")));
        create_dirs(root.path(), Path::new("a/b")).expect("create");
        assert!(parents_are_real(root.path(), Path::new("a/b/file")));
    }
}
