//! File digests for a whole link, computed once per unique file, in parallel, streaming.
//!
//! Jobs share most of their inputs (every module that others import from appears in many jobs), so
//! hashing per job would hash the popular modules hundreds of times. All input files of the link are
//! hashed up front by a few threads; the planner then only looks digests up. The same pass reads each
//! module's own hash (MODULE_CODE_HASH), which the canonical layout matches index-shard entries by.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::reapi::digest::{self, Digest};

/// What the planner needs to know of an input file.
#[derive(Debug, Clone, PartialEq)]
pub struct FileInfo {
    pub digest: Digest,
    pub executable: bool,
    /// The LLVM module hash, when the file is bitcode that records one.
    pub module_hash: Option<[u32; 5]>,
}

/// Files up to this size are read whole, once, for both digests; larger ones are hashed streaming
/// and get no module hash (their shard entries are then matched by path).
const READ_WHOLE_LIMIT: u64 = 64 << 20;

/// Digests of every input file of a link, keyed by the path as the job file names it.
#[derive(Debug, Default)]
pub struct FileDigests {
    files: HashMap<PathBuf, FileInfo>,
}

impl FileDigests {
    /// Hashes every distinct path in `paths` with up to `threads` threads. Fails on the first file that
    /// cannot be read, naming it.
    pub fn compute<'a>(
        paths: impl IntoIterator<Item = &'a Path>,
        threads: usize,
    ) -> Result<FileDigests, String> {
        let mut unique: Vec<&Path> = paths.into_iter().collect();
        unique.sort();
        unique.dedup();
        let next = AtomicUsize::new(0);
        let results = Mutex::new(HashMap::with_capacity(unique.len()));
        let first_error = Mutex::new(None);
        std::thread::scope(|scope| {
            for _ in 0..threads.clamp(1, unique.len().max(1)) {
                scope.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(path) = unique.get(i) else { break };
                        match hash_file(path) {
                            Ok(info) => {
                                if let Ok(mut r) = results.lock() {
                                    r.insert(path.to_path_buf(), info);
                                }
                            }
                            Err(e) => {
                                if let Ok(mut slot) = first_error.lock() {
                                    slot.get_or_insert(e);
                                }
                                next.store(unique.len(), Ordering::Relaxed);
                            }
                        }
                    }
                });
            }
        });
        if let Some(e) = first_error.into_inner().ok().flatten() {
            return Err(e);
        }
        Ok(FileDigests {
            files: results.into_inner().unwrap_or_default(),
        })
    }

    /// The digest of a file given to [`FileDigests::compute`].
    pub fn get(&self, path: &Path) -> Option<&FileInfo> {
        self.files.get(path)
    }
}

fn hash_file(path: &Path) -> Result<FileInfo, String> {
    let error = |e: std::io::Error| format!("{}: {e}", path.display());
    let meta = std::fs::metadata(path).map_err(error)?;
    let executable = meta.permissions().mode() & 0o111 != 0;
    if meta.len() > READ_WHOLE_LIMIT {
        let digest = digest::of_file(path).map_err(error)?;
        return Ok(FileInfo {
            digest,
            executable,
            module_hash: None,
        });
    }
    let bytes = std::fs::read(path).map_err(error)?;
    Ok(FileInfo {
        digest: digest::of_bytes(&bytes),
        executable,
        module_hash: crate::bitcode::module_hash(&bytes).ok().flatten(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_each_file_once_and_reports_missing_ones() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a (1).o");
        std::fs::write(&a, b"abc").unwrap();
        let b = dir.path().join("b.o");
        std::fs::write(&b, b"abc").unwrap();
        std::fs::set_permissions(&b, std::fs::Permissions::from_mode(0o755)).unwrap();
        let digests = FileDigests::compute([a.as_path(), b.as_path(), a.as_path()], 4).unwrap();
        assert_eq!(digests.get(&a).unwrap().digest, digest::of_bytes(b"abc"));
        assert!(!digests.get(&a).unwrap().executable);
        assert!(digests.get(&b).unwrap().executable);
        let missing = dir.path().join("gone.o");
        let err = FileDigests::compute([a.as_path(), missing.as_path()], 2).unwrap_err();
        assert!(err.contains("gone.o"), "{err}");
    }
}
