//! File digests for a whole link, computed once per unique file, in parallel, streaming.
//!
//! Jobs share most of their inputs (every module that others import from appears in many jobs), so
//! hashing per job would hash the popular modules hundreds of times. All input files of the link are
//! hashed up front by a few threads; the planner then only looks digests up. The same pass reads each
//! module's own hash (MODULE_CODE_HASH), which the canonical layout matches index-shard entries by.
//! Both are remembered in the [`DigestCache`], so an input unchanged since an earlier link costs one
//! `stat`.

use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rustc_hash::{FxHashMap, FxHashSet};
use serde::{Deserialize, Serialize};

use crate::cache::DigestCache;
use crate::cache::digest_cache::Remembered;
use crate::reapi::digest::{self, Digest};

/// What the planner needs to know of an input file.
/// One input file of an Action: its path in the link and the digest of its content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputPart {
    pub path: PathBuf,
    pub digest: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct FileInfo {
    /// The file's path as the job file names it (shared by every Action that has the file).
    pub local: Arc<Path>,
    pub digest: Digest,
    /// Its name in a canonical input root, `<hash>.o`, made once per link.
    pub content_name: Arc<str>,
    /// Whether another input of the link (at another path) has the same content.
    pub has_twin: bool,
    pub executable: bool,
    /// The LLVM module hash, when the file is bitcode that records one.
    pub module_hash: Option<[u32; 5]>,
    /// The file as `--stats-json` records it in every Action that has it: made once per link and
    /// shared, as one module is an input of ~100 jobs.
    pub part: Arc<InputPart>,
}

/// Input files per hashing thread, at least: starting a thread costs about what knowing a dozen
/// files from the digest cache does (a `stat` each).
const FILES_PER_THREAD: usize = 16;

/// Files up to this size are read whole, once, for both digests; larger ones are hashed streaming
/// and get no module hash (their shard entries are then matched by path).
const READ_WHOLE_LIMIT: u64 = 64 << 20;

/// How the link's input files were known (`--stats-json` `inputs`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct HashingStats {
    /// Files read and hashed, and their bytes.
    pub files_hashed: u64,
    pub bytes_hashed: u64,
    /// Files whose digests the digest cache remembered (not opened), and their bytes.
    pub files_from_digest_cache: u64,
    pub bytes_from_digest_cache: u64,
    /// Index shards rewritten (canonical layout), and rewrites whose digests the digest cache
    /// knew (made only if an Action had to be uploaded).
    #[serde(default)]
    pub shards_rewritten: u64,
    #[serde(default)]
    pub shard_rewrites_from_digest_cache: u64,
}

impl HashingStats {
    fn count(&mut self, bytes: u64, from_cache: bool) {
        if from_cache {
            self.files_from_digest_cache += 1;
            self.bytes_from_digest_cache += bytes;
        } else {
            self.files_hashed += 1;
            self.bytes_hashed += bytes;
        }
    }
}

/// Digests of every input file of a link, keyed by the path as the job file names it (its bytes:
/// looked up ~100 times per job with many imports, and hashing a `Path` walks its components; with
/// FxHash, as SipHash's resistance to chosen keys buys nothing for the link's own file names).
#[derive(Debug, Default)]
pub struct FileDigests {
    files: FxHashMap<OsString, Arc<FileInfo>>,
    stats: HashingStats,
}

impl FileDigests {
    /// Knows every distinct path in `paths`, from `cache` or by hashing it (then remembered in
    /// `cache`), with up to `threads` threads. Fails on the first file that cannot be read, naming
    /// it.
    pub fn compute<'a>(
        paths: impl IntoIterator<Item = &'a Path>,
        threads: usize,
        cache: &DigestCache,
    ) -> Result<FileDigests, String> {
        // Distinct as the keys are: by bytes. Deduplicated as they come: a link lists each module
        // once per job that imports it (1.6 million paths for 100,000 files at 50,000 jobs).
        let mut seen = FxHashSet::default();
        let unique: Vec<&Path> = paths
            .into_iter()
            .filter(|path| seen.insert(path.as_os_str()))
            .collect();
        drop(seen);
        let next = AtomicUsize::new(0);
        let known = Mutex::new((
            FxHashMap::with_capacity_and_hasher(unique.len(), Default::default()),
            HashingStats::default(),
        ));
        let first_error = Mutex::new(None);
        let work = || {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(path) = unique.get(i) else { break };
                match know_file(path, cache) {
                    Ok((info, from_cache)) => {
                        if let Ok(mut known) = known.lock() {
                            known.1.count(digest::size(&info.digest), from_cache);
                            known.0.insert(path.as_os_str().to_owned(), Arc::new(info));
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
        };
        // The calling thread works too, and each thread has files enough to pay for starting
        // it: a one-job relink's two files were hashed by threads started for one file each.
        let helpers = threads
            .min(unique.len().div_ceil(FILES_PER_THREAD))
            .saturating_sub(1);
        std::thread::scope(|scope| {
            for _ in 0..helpers {
                scope.spawn(work);
            }
            work();
        });
        if let Some(e) = first_error.into_inner().ok().flatten() {
            return Err(e);
        }
        let (mut files, stats): (FxHashMap<OsString, Arc<FileInfo>>, _) =
            known.into_inner().unwrap_or_default();
        let mut contents: FxHashMap<String, usize> =
            FxHashMap::with_capacity_and_hasher(files.len(), Default::default());
        for info in files.values() {
            *contents.entry(info.digest.hash.clone()).or_default() += 1;
        }
        for info in files.values_mut() {
            if contents[&info.digest.hash] > 1
                && let Some(info) = Arc::get_mut(info)
            {
                info.has_twin = true;
            }
        }
        Ok(FileDigests { files, stats })
    }

    /// The digest of a file given to [`FileDigests::compute`].
    pub fn get(&self, path: &Path) -> Option<&Arc<FileInfo>> {
        self.files.get(path.as_os_str())
    }

    /// How many files and bytes were hashed, and how many the digest cache knew.
    pub fn stats(&self) -> HashingStats {
        self.stats
    }
}

/// The file's digests and whether they came from `cache`: one `stat` when remembered, else read
/// through one handle (whole, or streaming when large).
fn know_file(path: &Path, cache: &DigestCache) -> Result<(FileInfo, bool), String> {
    let known = cache
        .get_or_read(path, |file, meta| {
            if meta.len() > READ_WHOLE_LIMIT {
                return Ok(Remembered {
                    digest: digest::of_reader(file, meta.len())?,
                    module_hash: None,
                });
            }
            let mut bytes = Vec::with_capacity(meta.len() as usize);
            // Through `take`, which spares the size probe (two more system calls) `File` makes.
            file.take(u64::MAX).read_to_end(&mut bytes)?;
            Ok(Remembered {
                digest: digest::of_bytes(&bytes),
                module_hash: crate::bitcode::module_hash(&bytes).ok().flatten(),
            })
        })
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let part = Arc::new(InputPart {
        path: path.to_owned(),
        digest: digest::display(&known.remembered.digest).to_string(),
    });
    let info = FileInfo {
        local: path.into(),
        content_name: format!("{}.o", known.remembered.digest.hash).into(),
        has_twin: false,
        digest: known.remembered.digest,
        executable: crate::platform::executable_bit(&known.meta),
        module_hash: known.remembered.module_hash,
        part,
    };
    Ok((info, known.from_cache))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn hashes_each_file_once_and_reports_missing_ones() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a (1).o");
        std::fs::write(&a, b"abc").unwrap();
        let b = dir.path().join("b.o");
        std::fs::write(&b, b"abc").unwrap();
        std::fs::set_permissions(&b, std::fs::Permissions::from_mode(0o755)).unwrap();
        let cache = DigestCache::open(None);
        let digests =
            FileDigests::compute([a.as_path(), b.as_path(), a.as_path()], 4, &cache).unwrap();
        assert_eq!(digests.get(&a).unwrap().digest, digest::of_bytes(b"abc"));
        assert!(!digests.get(&a).unwrap().executable);
        assert!(digests.get(&b).unwrap().executable);
        // Same content at two paths: twins, which canonical layouts name apart.
        assert!(digests.get(&a).unwrap().has_twin && digests.get(&b).unwrap().has_twin);
        let alone = dir.path().join("c.o");
        std::fs::write(&alone, b"c").unwrap();
        let digests = FileDigests::compute([a.as_path(), alone.as_path()], 2, &cache).unwrap();
        assert!(!digests.get(&a).unwrap().has_twin && !digests.get(&alone).unwrap().has_twin);
        let missing = dir.path().join("gone.o");
        let err = FileDigests::compute([a.as_path(), missing.as_path()], 2, &cache).unwrap_err();
        assert!(err.contains("gone.o"), "{err}");
    }

    #[test]
    fn many_files_are_hashed_by_the_caller_and_helper_threads_alike() {
        let dir = tempfile::tempdir().unwrap();
        let paths: Vec<PathBuf> = (0..100)
            .map(|i| {
                let path = dir.path().join(format!("m{i}.o"));
                std::fs::write(&path, format!("module {i}")).unwrap();
                path
            })
            .collect();
        let cache = DigestCache::open(None);
        let digests = FileDigests::compute(paths.iter().map(PathBuf::as_path), 4, &cache).unwrap();
        for (i, path) in paths.iter().enumerate() {
            let expected = digest::of_bytes(format!("module {i}").as_bytes());
            assert_eq!(
                digests.get(path).unwrap().digest,
                expected,
                "{}",
                path.display()
            );
        }
        assert_eq!(digests.stats().files_hashed, 100);
        // A file that cannot be read fails the whole, named, whichever thread met it.
        let mut with_missing = paths.clone();
        with_missing.insert(57, dir.path().join("gone.o"));
        let err =
            FileDigests::compute(with_missing.iter().map(PathBuf::as_path), 4, &cache).unwrap_err();
        assert!(err.contains("gone.o"), "{err}");
    }
}
