//! Big input files are placed in action directories by hard link, not copied: a 185 MB compiler
//! that is an input of every action must cost nothing per action, as on real workers (Buildbarn,
//! BuildBuddy and NativeLink link inputs from their file caches).
//!
//! Each big blob is written once, per executable bit, to a directory beside the actions' (same
//! file system, so links work), read-only, and linked from there. A link shares its mode with every
//! other link of the file, hence one copy per executable bit. Small files are written directly:
//! for them a link saves nothing.
//!
//! Sharing is safe only because no action can write a shared copy: the server uses it only when
//! actions run as uids of their own (the server is root), to which the copies (root's, mode 0444
//! or 0555) are read-only. A copy found on disk from an earlier run (`--work-dir`) is checked
//! against its digest the first time this process hands it out.

use std::collections::HashSet;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tonic::Status;

use super::digest::BlobDigest;
use super::storage::Storage;

/// Blobs at least this big are linked.
pub const LINK_THRESHOLD: u64 = 1 << 20;

/// The directory of linkable copies.
#[derive(Debug, Clone)]
pub struct SharedFiles {
    dir: PathBuf,
    /// The copies this process wrote or checked: known to hold their blob.
    known: Arc<Mutex<HashSet<PathBuf>>>,
}

impl SharedFiles {
    /// Keeps its copies in `dir` (created), which must be on the action directories' file system.
    pub fn new(dir: PathBuf) -> anyhow::Result<SharedFiles> {
        std::fs::create_dir_all(&dir)
            .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
        // Actions reach their links, never this directory (which would list other clients' big
        // inputs).
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| anyhow::anyhow!("cannot protect {}: {e}", dir.display()))?;
        Ok(SharedFiles {
            dir,
            known: Arc::default(),
        })
    }

    /// Whether `shared`, the copy of `blob` with `mode`, is known to this process or checks out:
    /// read-only, the server's, holding the blob. A copy that does not is removed.
    fn trusted(&self, shared: &Path, blob: &BlobDigest, mode: u32) -> Result<bool, Status> {
        let mut known = self
            .known
            .lock()
            .map_err(|_| Status::internal("shared input lock poisoned"))?;
        if known.contains(shared) {
            return Ok(true);
        }
        let Ok(meta) = std::fs::symlink_metadata(shared) else {
            return Ok(false);
        };
        // SAFETY: geteuid cannot fail.
        let owner = unsafe { libc::geteuid() };
        let sound = meta.is_file()
            && meta.uid() == owner
            && meta.mode() & 0o7777 == mode
            && std::fs::read(shared).is_ok_and(|data| BlobDigest::of(&data) == *blob);
        if sound {
            known.insert(shared.to_path_buf());
        } else {
            // Best effort: a copy that cannot be removed fails the persist below, clearly.
            let _ = std::fs::remove_file(shared);
        }
        Ok(sound)
    }

    /// Creates `target` with the content of `blob` and the executable bit `executable`: a hard link
    /// to the shared copy (written first if needed), or a copy when linking is impossible.
    pub fn place(
        &self,
        storage: &Storage,
        blob: &BlobDigest,
        executable: bool,
        target: &Path,
    ) -> Result<(), Status> {
        let shared = self.dir.join(format!(
            "{}-{}-{}",
            blob.hash,
            blob.size,
            if executable { "x" } else { "r" }
        ));
        let io = |path: &Path, e: std::io::Error| {
            Status::internal(format!("cannot materialize {}: {e}", path.display()))
        };
        let mode = if executable { 0o555 } else { 0o444 };
        if !self.trusted(&shared, blob, mode)? {
            let data = storage.blob(blob)?.ok_or_else(|| {
                super::context::missing_blobs(
                    "the input root is incomplete",
                    std::slice::from_ref(blob),
                )
            })?;
            let mut tmp = tempfile::NamedTempFile::new_in(&self.dir).map_err(|e| io(&shared, e))?;
            tmp.write_all(&data).map_err(|e| io(&shared, e))?;
            tmp.as_file()
                .set_permissions(std::fs::Permissions::from_mode(mode))
                .map_err(|e| io(&shared, e))?;
            // Another action may have written it meanwhile: either copy is the same blob.
            tmp.persist(&shared).map_err(|e| io(&shared, e.error))?;
            if let Ok(mut known) = self.known.lock() {
                known.insert(shared.clone());
            }
        }
        if std::fs::hard_link(&shared, target).is_ok() {
            return Ok(());
        }
        // Too many links, or another file system: a copy with the same mode does as well.
        std::fs::copy(&shared, target)
            .map(drop)
            .map_err(|e| io(target, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_one_copy_per_executable_bit() {
        let dir = tempfile::tempdir().unwrap();
        let storage = Storage::open(None).unwrap();
        let blob = storage.add_blob(b"big enough in spirit").unwrap();
        let shared = SharedFiles::new(dir.path().join("shared")).unwrap();
        let place = |name: &str, executable| {
            let target = dir.path().join(name);
            shared.place(&storage, &blob, executable, &target).unwrap();
            std::fs::metadata(target).unwrap()
        };
        let (a, b, x) = (place("a", false), place("b", false), place("x", true));
        assert_eq!(a.ino(), b.ino());
        assert_ne!(a.ino(), x.ino());
        assert_eq!(a.mode() & 0o777, 0o444);
        assert_eq!(x.mode() & 0o777, 0o555);
        assert_eq!(
            std::fs::read(dir.path().join("x")).unwrap(),
            b"big enough in spirit"
        );

        // A copy left by an earlier run that no longer holds its blob is replaced.
        let copy = dir
            .path()
            .join("shared")
            .join(format!("{}-{}-r", blob.hash, blob.size));
        std::fs::remove_file(&copy).unwrap();
        std::fs::write(&copy, b"tampered in spirit!!").unwrap();
        std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o444)).unwrap();
        let fresh = SharedFiles::new(dir.path().join("shared")).unwrap();
        fresh
            .place(&storage, &blob, false, &dir.path().join("c"))
            .unwrap();
        assert_eq!(
            std::fs::read(dir.path().join("c")).unwrap(),
            b"big enough in spirit"
        );

        let absent = BlobDigest::of(b"never stored");
        let err = shared
            .place(&storage, &absent, false, &dir.path().join("d"))
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    }
}
