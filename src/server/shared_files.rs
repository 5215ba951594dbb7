//! Big input files are placed in action directories by hard link, not copied: a 185 MB compiler
//! that is an input of every action must cost nothing per action, as on real workers (Buildbarn,
//! BuildBuddy and NativeLink link inputs from their file caches).
//!
//! Each big blob is written once, per executable bit, to a directory beside the actions' (same
//! file system, so links work), read-only, and linked from there. A link shares its mode with every
//! other link of the file, hence one copy per executable bit. Small files are written directly:
//! for them a link saves nothing.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use tonic::Status;

use super::digest::BlobDigest;
use super::storage::Storage;

/// Blobs at least this big are linked.
pub const LINK_THRESHOLD: u64 = 1 << 20;

/// The directory of linkable copies.
#[derive(Debug, Clone)]
pub struct SharedFiles {
    dir: PathBuf,
}

impl SharedFiles {
    /// Keeps its copies in `dir` (created), which must be on the action directories' file system.
    pub fn new(dir: PathBuf) -> anyhow::Result<SharedFiles> {
        std::fs::create_dir_all(&dir)
            .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
        Ok(SharedFiles { dir })
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
        if !shared.exists() {
            let data = storage.blob(blob)?.ok_or_else(|| {
                super::context::missing_blobs(
                    "the input root is incomplete",
                    std::slice::from_ref(blob),
                )
            })?;
            let mut tmp = tempfile::NamedTempFile::new_in(&self.dir).map_err(|e| io(&shared, e))?;
            tmp.write_all(&data).map_err(|e| io(&shared, e))?;
            let mode = if executable { 0o555 } else { 0o444 };
            tmp.as_file()
                .set_permissions(std::fs::Permissions::from_mode(mode))
                .map_err(|e| io(&shared, e))?;
            // Another action may have written it meanwhile: either copy is the same blob.
            tmp.persist(&shared).map_err(|e| io(&shared, e.error))?;
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
    use std::os::unix::fs::MetadataExt;

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

        let absent = BlobDigest::of(b"never stored");
        let err = shared
            .place(&storage, &absent, false, &dir.path().join("c"))
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    }
}
