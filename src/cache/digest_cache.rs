//! A persistent map from a file's identity on disk to its content digest, so that big files that do
//! not change between links (a 185 MB compiler) are hashed once, not on every link.
//!
//! A file is known by its path, device, inode, size, modification time and status-change time: any
//! write, truncation, rename over it or `touch` changes one of them. Files modified within the last
//! [`RACY_WINDOW`] are not remembered, since a write in the same timestamp tick would go unseen.
//!
//! The map is one text file. Links running at once each load it, add what they hashed and write it
//! back whole (merged with what is on disk by then) under a temporary name renamed into place, so a
//! reader never sees a torn file; a concurrent writer's entries may be lost, which only costs a hash.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use crate::reapi::digest::{self, Digest};

/// Files changed more recently than this are hashed but not remembered.
const RACY_WINDOW: Duration = Duration::from_secs(2);

/// Entries kept at most; beyond it, entries this process did not use are dropped first.
const MAX_ENTRIES: usize = 100_000;

/// The first line of the file, naming its format.
const HEADER: &str = "dtlto-reapi digest cache v1";

/// What identifies one version of a file on disk.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FileKey {
    path: PathBuf,
    device: u64,
    inode: u64,
    size: u64,
    mtime_ns: i64,
    ctime_ns: i64,
}

impl FileKey {
    /// The key of `path` as `meta` (its metadata, symlinks followed) describes it.
    pub fn new(path: &Path, meta: &std::fs::Metadata) -> FileKey {
        FileKey {
            path: path.to_path_buf(),
            device: meta.dev(),
            inode: meta.ino(),
            size: meta.len(),
            mtime_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
            ctime_ns: meta.ctime() * 1_000_000_000 + meta.ctime_nsec(),
        }
    }

    fn to_line(&self, digest: &Digest) -> Option<Vec<u8>> {
        let path = self.path.as_os_str().as_bytes();
        if path.contains(&b'\n') {
            return None;
        }
        let mut line = format!(
            "{} {} {} {} {} {} {} ",
            self.device,
            self.inode,
            self.size,
            self.mtime_ns,
            self.ctime_ns,
            digest.hash,
            digest.size_bytes
        )
        .into_bytes();
        line.extend_from_slice(path);
        line.push(b'\n');
        Some(line)
    }

    fn from_line(line: &[u8]) -> Option<(FileKey, Digest)> {
        let mut fields = line.splitn(8, |&b| b == b' ');
        let mut number =
            || -> Option<i64> { std::str::from_utf8(fields.next()?).ok()?.parse().ok() };
        let (device, inode, size) = (number()?, number()?, number()?);
        let (mtime_ns, ctime_ns) = (number()?, number()?);
        let hash = std::str::from_utf8(fields.next()?).ok()?.to_owned();
        let size_bytes = std::str::from_utf8(fields.next()?).ok()?.parse().ok()?;
        let path = PathBuf::from(OsStr::from_bytes(fields.next()?));
        let digest = Digest { hash, size_bytes };
        let key = FileKey {
            path,
            device: u64::try_from(device).ok()?,
            inode: u64::try_from(inode).ok()?,
            size: u64::try_from(size).ok()?,
            mtime_ns,
            ctime_ns,
        };
        (digest::is_valid(&digest) && digest.size_bytes == size).then_some((key, digest))
    }
}

#[derive(Debug)]
struct Entry {
    digest: Digest,
    /// Looked up or inserted by this process (kept first when the map is trimmed).
    used: bool,
}

/// The digest cache of one process, loaded from and saved to one file.
#[derive(Debug)]
pub struct DigestCache {
    /// None: remembered by this process only (the system has no user cache directory).
    file: Option<PathBuf>,
    entries: Mutex<HashMap<FileKey, Entry>>,
    /// Something was inserted since loading: [`DigestCache::save`] has work to do.
    changed: AtomicBool,
}

impl DigestCache {
    /// `<user cache dir>/dtlto-reapi/file-digests`.
    pub fn default_file() -> Option<PathBuf> {
        dirs::cache_dir().map(|d| d.join("dtlto-reapi").join("file-digests"))
    }

    /// Loads the cache kept in `file`; a missing, unreadable or foreign file is an empty cache.
    pub fn open(file: Option<PathBuf>) -> DigestCache {
        let entries = file
            .as_ref()
            .and_then(|file| std::fs::read(file).ok())
            .map(|bytes| parse(&bytes))
            .unwrap_or_default();
        DigestCache {
            file,
            entries: Mutex::new(entries),
            changed: AtomicBool::new(false),
        }
    }

    /// The remembered digest of `path`, if it has not changed since.
    pub fn lookup(&self, path: &Path, meta: &std::fs::Metadata) -> Option<Digest> {
        let mut entries = self.entries.lock().ok()?;
        let entry = entries.get_mut(&FileKey::new(path, meta))?;
        entry.used = true;
        Some(entry.digest.clone())
    }

    /// Remembers `digest` as the content of `path` as `meta` describes it.
    pub fn insert(&self, path: &Path, meta: &std::fs::Metadata, digest: Digest) {
        if let Ok(mut entries) = self.entries.lock() {
            let entry = Entry { digest, used: true };
            entries.insert(FileKey::new(path, meta), entry);
            self.changed.store(true, Ordering::Relaxed);
        }
    }

    /// The digest of the file at `path` and its metadata: remembered, or hashed and remembered.
    pub fn digest_of(&self, path: &Path) -> std::io::Result<(Digest, std::fs::Metadata)> {
        let meta = std::fs::metadata(path)?;
        if let Some(digest) = self.lookup(path, &meta) {
            return Ok((digest, meta));
        }
        let digest = digest::of_file(path)?;
        // Remember it only when the file did not change while it was read, nor just before.
        let unchanged = std::fs::metadata(path)
            .is_ok_and(|after| FileKey::new(path, &after) == FileKey::new(path, &meta));
        if unchanged && !changed_recently(&meta) {
            self.insert(path, &meta, digest.clone());
        }
        Ok((digest, meta))
    }

    /// Writes the cache back, merged with entries other processes saved meanwhile: to a temporary
    /// file beside it, renamed into place. Nothing is written when nothing was inserted.
    pub fn save(&self) -> std::io::Result<()> {
        if !self.changed.swap(false, Ordering::Relaxed) {
            return Ok(());
        }
        let (Some(file), Ok(mut entries)) = (&self.file, self.entries.lock()) else {
            return Ok(());
        };
        if let Ok(bytes) = std::fs::read(file) {
            for (key, entry) in parse(&bytes) {
                entries.entry(key).or_insert(entry);
            }
        }
        if entries.len() > MAX_ENTRIES {
            entries.retain(|_, entry| entry.used);
        }
        let dir = file.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)?;
        let mut out = std::io::BufWriter::new(tempfile::NamedTempFile::new_in(dir)?);
        writeln!(out, "{HEADER}")?;
        for (key, entry) in entries.iter().take(MAX_ENTRIES) {
            if let Some(line) = key.to_line(&entry.digest) {
                out.write_all(&line)?;
            }
        }
        let tmp = out.into_inner().map_err(|e| e.into_error())?;
        tmp.persist(file).map_err(|e| e.error)?;
        Ok(())
    }
}

fn parse(bytes: &[u8]) -> HashMap<FileKey, Entry> {
    let mut lines = bytes.split(|&b| b == b'\n');
    if lines.next() != Some(HEADER.as_bytes()) {
        return HashMap::new();
    }
    lines
        .filter_map(FileKey::from_line)
        .map(|(key, digest)| {
            (
                key,
                Entry {
                    digest,
                    used: false,
                },
            )
        })
        .collect()
}

/// Whether the file's content or status changed within [`RACY_WINDOW`] (or in the future): a
/// write in the same timestamp tick as the hashing would then go unnoticed.
fn changed_recently(meta: &std::fs::Metadata) -> bool {
    // The status-change time too, which `touch -m` cannot set back.
    let ctime = u64::try_from(meta.ctime())
        .ok()
        .map(|s| SystemTime::UNIX_EPOCH + Duration::from_secs(s));
    [meta.modified().ok(), ctime].into_iter().any(|time| {
        time.and_then(|t| t.elapsed().ok())
            .is_none_or(|age| age < RACY_WINDOW)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_across_processes_and_forgets_changed_files() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("cache/file-digests");
        let file = dir.path().join("compiler with spaces");
        std::fs::write(&file, b"abc").unwrap();
        let meta = std::fs::metadata(&file).unwrap();

        // A file that just changed is hashed but not remembered.
        let cache = DigestCache::open(Some(store.clone()));
        assert_eq!(cache.digest_of(&file).unwrap().0, digest::of_bytes(b"abc"));
        assert!(cache.lookup(&file, &meta).is_none());

        // What is inserted is saved and found by the next process, for this file version only.
        cache.insert(&file, &meta, digest::of_bytes(b"abc"));
        cache.save().unwrap();
        let again = DigestCache::open(Some(store.clone()));
        assert_eq!(again.lookup(&file, &meta), Some(digest::of_bytes(b"abc")));
        assert!(again.lookup(&dir.path().join("elsewhere"), &meta).is_none());
        std::fs::write(&file, b"abd").unwrap();
        let changed = std::fs::metadata(&file).unwrap();
        assert!(again.lookup(&file, &changed).is_none());
        assert_eq!(again.digest_of(&file).unwrap().0, digest::of_bytes(b"abd"));

        // Saving merges with what another process saved meanwhile.
        let other = DigestCache::open(Some(store.clone()));
        other.insert(&file, &changed, digest::of_bytes(b"abd"));
        other.save().unwrap();
        again.save().unwrap();
        let merged = DigestCache::open(Some(store));
        assert!(merged.lookup(&file, &meta).is_some());
        assert!(merged.lookup(&file, &changed).is_some());
    }

    #[test]
    fn foreign_or_damaged_files_are_empty_caches() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("file-digests");
        std::fs::write(&store, b"something else\n1 2 3\n").unwrap();
        assert!(
            DigestCache::open(Some(store.clone()))
                .entries
                .lock()
                .unwrap()
                .is_empty()
        );
        // Only the well-formed line whose digest size matches the file size survives.
        let hash = "a".repeat(64);
        let lines = format!("{HEADER}\n1 2 3 4 5 {hash} 3 /p q\n1 2 4 4 5 {hash} 3 /r\n1 2 x\n");
        std::fs::write(&store, lines).unwrap();
        let cache = DigestCache::open(Some(store));
        let entries = cache.entries.lock().unwrap();
        assert_eq!(entries.len(), 1);
        assert!(entries.keys().all(|k| k.path == Path::new("/p q")));
    }
}
