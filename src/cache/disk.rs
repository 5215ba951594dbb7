//! `--disk-cache DIR`: a local content-addressed store (CAS) and action cache (AC) in a directory.
//!
//! A ThinLTO backend compile is a pure function of its REAPI Action, so its outputs can be reused
//! by any later link on this machine whose job has the same Action digest: the executor asks
//! [`DiskCache::get_action_result`] before running anything (locally or remotely), copies the
//! outputs out with [`DiskCache::fetch_blob`] on a hit, and stores them with
//! [`DiskCache::store_file`] and [`DiskCache::put_action_result`] after a successful compile.
//!
//! # Layout
//!
//! ```text
//! DIR/cas/<first 2 hex>/<sha256>   blob bytes
//! DIR/ac/<first 2 hex>/<sha256>    ActionResult (protobuf) keyed by the Action digest
//! DIR/tmp/                         files being written
//! DIR/lock                         flock(2)-style lock guarding DIR/size and eviction
//! DIR/size                         approximate total of cas/ and ac/ in bytes (decimal text)
//! ```
//!
//! An entry's modification time is its last use: every hit sets it to now, and [`DiskCache::trim`]
//! deletes the entries with the oldest times first.
//!
//! # Why concurrent links cannot corrupt it
//!
//! - **Entries are never written in place.** Each is written in full to a unique file in `tmp/`
//!   (same filesystem) and then renamed to its name, which is atomic: a reader opening the name
//!   sees either no file or a complete one. Renaming over an existing entry leaves a reader that
//!   already opened it reading the old, equally complete file.
//! - **Writers of the same name agree.** A CAS name is the hash of the content, so two links
//!   storing the same blob write identical bytes and either copy is right; two results for one
//!   Action are interchangeable outputs of the same compile.
//! - **Readers verify.** A blob's size is checked before an action result is reported as a hit and
//!   its SHA-256 while it is copied out; a blob or result that fails (a torn write after a power
//!   loss, since nothing is fsync'd; a disk error; someone's garbage) is deleted and reported as a
//!   miss. So a cache entry can be lost, but a wrong output is never produced.
//! - **Eviction only unlinks.** A reader that opened an entry before it was deleted still reads
//!   the whole file; one that comes after finds nothing and reports a miss. A caller that got an
//!   action result and then fails to fetch one of its blobs must treat the job as a miss.
//! - **New entries are created without replacing** (`renameat2(RENAME_NOREPLACE)` or `link`), so
//!   exactly one writer of a name learns that it created it and counts its size. A writer that
//!   finds a blob of the right size already there keeps it (and marks it used); a blob of the
//!   wrong size, or an action result, is replaced by a rename.
//! - **The size total is updated under an exclusive lock** on `DIR/lock`, and only when this
//!   process has added enough bytes since its last update (or on [`DiskCache::trim`] and drop),
//!   so stores rarely contend and never rescan the directory. The total is approximate: it errs
//!   high (a blob deleted as damaged stays counted; bytes stored during a scan are counted by
//!   both) except for an action result replaced just as it was evicted, which nobody counts.
//!   Whenever the total exceeds the bound, a full scan replaces it with the exact figure.
//!
//! These arguments rely on POSIX rename and unlink semantics (Linux, macOS).
//!
//! # Why another user cannot use it against this one
//!
//! A cache directory owned by another user, or writable by group or others, is refused when it is
//! opened: whoever can write it could plant entries (wrong objects under right names) or symlinks.
//! Inside the cache, symlinks are never followed: files are opened with `O_NOFOLLOW` (on
//! Windows `FILE_FLAG_OPEN_REPARSE_POINT`, refusing a reparse point), a shard directory that is not a
//! real directory is removed, the size total is replaced by a rename
//! rather than written through whatever its name points to, and scans ignore symlinks.

use std::fs::{self, File, FileTimes};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use prost::Message;
use tempfile::NamedTempFile;

use crate::platform;
use crate::reapi::digest::{self, Hasher};
use crate::reapi::{ActionResult, Digest};

/// The size bound when `--disk-cache-max-size` is not given: 10 GiB.
pub const DEFAULT_MAX_BYTES: u64 = 10 << 30;

/// Temporary files older than this belong to a process that died mid-write.
const STALE_TEMP_AGE: Duration = Duration::from_secs(3600);

/// Read size for copying blobs in and out.
const COPY_BUFFER: usize = 1 << 20;

/// A local CAS and action cache in one directory. `Send + Sync`; every method blocks on file I/O
/// (the bulk ones, [`store_file`](Self::store_file), [`fetch_blob`](Self::fetch_blob) and
/// [`trim`](Self::trim), belong in `spawn_blocking` in async code).
#[derive(Debug)]
pub struct DiskCache {
    root: PathBuf,
    max_bytes: u64,
    /// Bytes of entries this process wrote and has not yet added to `DIR/size`.
    unflushed: AtomicU64,
}

/// The two namespaces of entries.
#[derive(Clone, Copy, Debug)]
enum Namespace {
    Cas,
    Ac,
}

impl Namespace {
    const ALL: [Namespace; 2] = [Namespace::Cas, Namespace::Ac];

    fn dir_name(self) -> &'static str {
        match self {
            Namespace::Cas => "cas",
            Namespace::Ac => "ac",
        }
    }
}

/// One file found by a scan of the entries.
struct ScannedEntry {
    path: PathBuf,
    len: u64,
    used: SystemTime,
}

impl DiskCache {
    /// Opens (creating if needed) the cache in `dir`, bounded to about `max_bytes`, and trims it
    /// (see [`trim`](Self::trim): cheap unless it is over this bound, or its total is unknown
    /// because the cache is new or damaged). Only creates what is missing and evicts only to meet
    /// the bound: an existing cache keeps its entries.
    /// Refuses a directory that another user could write (see the module's documentation).
    pub fn open(dir: &Path, max_bytes: u64) -> io::Result<DiskCache> {
        platform::private_dirs()
            .recursive(true)
            .create(dir)
            .map_err(|e| annotate(e, "cannot create", dir))?;
        // The directory itself may be a symlink the user chose; what it leads to must be private.
        let meta = fs::metadata(dir).map_err(|e| annotate(e, "cannot inspect", dir))?;
        check_private(dir, &meta)?;
        for sub in ["cas", "ac", "tmp"] {
            let path = dir.join(sub);
            real_dir(&path)?;
            let meta =
                fs::symlink_metadata(&path).map_err(|e| annotate(e, "cannot inspect", &path))?;
            check_private(&path, &meta)?;
        }
        let cache = DiskCache {
            root: dir.to_path_buf(),
            max_bytes,
            unflushed: AtomicU64::new(0),
        };
        cache.trim()?;
        Ok(cache)
    }

    /// Where the cache lives when `--disk-cache` is given without a directory: the user's cache
    /// directory (`$XDG_CACHE_HOME` or `~/.cache` on Linux, `~/Library/Caches` on macOS) plus
    /// `dtlto-reapi/disk-cache`. None when the platform has no such directory.
    pub fn default_dir() -> Option<PathBuf> {
        dirs::cache_dir().map(|d| d.join("dtlto-reapi").join("disk-cache"))
    }

    /// The cache's directory.
    pub fn dir(&self) -> &Path {
        &self.root
    }

    /// The action result stored for `action`, if there is one and every blob it names (output
    /// files, directory trees, stdout, stderr) is present with the right size; a result with a
    /// missing blob (partly evicted) is a miss. An unreadable result is deleted and is a miss. A
    /// hit marks the result and its blobs as just used.
    pub fn get_action_result(&self, action: &Digest) -> io::Result<Option<ActionResult>> {
        let Some(path) = self.entry_path(Namespace::Ac, action) else {
            return Ok(None);
        };
        let bytes = match read_file(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(annotate(e, "cannot read", &path)),
        };
        let result = match ActionResult::decode(bytes.as_slice()) {
            Ok(result) if referenced_blobs(&result).all(digest::is_valid) => result,
            _ => {
                remove_entry(&path);
                return Ok(None);
            }
        };
        for blob in referenced_blobs(&result) {
            if !self.has_blob(blob)? {
                return Ok(None);
            }
        }
        touch_path(&path);
        Ok(Some(result))
    }

    /// Copies the blob `digest` to `dest` (created or truncated), checking its size and SHA-256
    /// on the way. Returns false, leaving no `dest` behind, when the blob is absent or fails the
    /// check (it is then deleted from the cache). The empty blob is always present.
    pub fn fetch_blob(&self, digest: &Digest, dest: &Path) -> io::Result<bool> {
        if is_empty_blob(digest) {
            File::create(dest).map_err(|e| annotate(e, "cannot create", dest))?;
            return Ok(true);
        }
        let Some(path) = self.entry_path(Namespace::Cas, digest) else {
            return Ok(false);
        };
        let mut source = match open_file(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(annotate(e, "cannot open", &path)),
        };
        let len = source
            .metadata()
            .map_err(|e| annotate(e, "cannot inspect", &path))?
            .len();
        if len != digest::size(digest) {
            remove_entry(&path);
            return Ok(false);
        }
        let copied = File::create(dest)
            .and_then(|mut out| copy_hashing(&mut source, &mut out))
            .map_err(|e| annotate(e, "cannot copy the cached blob to", dest));
        match copied {
            Ok(got) if got == *digest => {
                touch(&source);
                Ok(true)
            }
            Ok(_) => {
                let _ = fs::remove_file(dest);
                remove_entry(&path);
                Ok(false)
            }
            Err(e) => {
                let _ = fs::remove_file(dest);
                Err(e)
            }
        }
    }

    /// Stores the file at `path` (read once, hashing as it is copied) and returns its digest.
    pub fn store_file(&self, path: &Path) -> io::Result<Digest> {
        let mut file = File::open(path).map_err(|e| annotate(e, "cannot open", path))?;
        self.store_blob(&mut file)
    }

    /// Stores `bytes` and returns their digest.
    pub fn store_bytes(&self, bytes: &[u8]) -> io::Result<Digest> {
        self.store_blob(&mut &*bytes)
    }

    /// Stores `result` as the outcome of `action`, replacing any earlier one. Store the blobs it
    /// names first: until they are present, the result reads as a miss.
    pub fn put_action_result(&self, action: &Digest, result: &ActionResult) -> io::Result<()> {
        let path = self.entry_path(Namespace::Ac, action).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "malformed action digest {} for the disk cache",
                    digest::display(action)
                ),
            )
        })?;
        let bytes = result.encode_to_vec();
        let mut temp = self.temp_file()?;
        temp.write_all(&bytes)?;
        self.commit(temp, Namespace::Ac, &path, bytes.len() as u64)
    }

    /// Brings the cache under its bound: adds what this process stored to the shared total and,
    /// when that exceeds the bound (or is unknown), scans the cache and deletes the least recently
    /// used entries until it holds at most 90% of the bound, so that the next few stores do not
    /// each trigger a scan. Also deletes files left in `tmp/` by processes that died. Cheap when
    /// the cache is under its bound: one small locked file is read and written.
    pub fn trim(&self) -> io::Result<()> {
        self.update_total(true)
    }

    /// Hashes `source` into a temporary file and moves it to its CAS name.
    fn store_blob(&self, source: &mut impl Read) -> io::Result<Digest> {
        let mut temp = self.temp_file()?;
        let digest = copy_hashing(source, temp.as_file_mut())?;
        let path = self
            .entry_path(Namespace::Cas, &digest)
            .ok_or_else(|| io::Error::other("computed a malformed digest"))?;
        self.commit(temp, Namespace::Cas, &path, digest::size(&digest))?;
        Ok(digest)
    }

    fn temp_file(&self) -> io::Result<NamedTempFile> {
        let dir = self.root.join("tmp");
        NamedTempFile::new_in(&dir)
            .or_else(|e| match e.kind() {
                // Deleted under a running cache (say, by `rm -rf ~/.cache`): start afresh.
                io::ErrorKind::NotFound => {
                    fs::create_dir_all(&dir)?;
                    NamedTempFile::new_in(&dir)
                }
                _ => Err(e),
            })
            .map_err(|e| annotate(e, "cannot create a file in", &dir))
    }

    /// Moves the complete `temp` to the entry `path` if no entry is there, counting `len` new
    /// bytes. Otherwise a CAS entry of the right size is kept (the content is the same; it is
    /// marked used) while a damaged blob or an older action result is replaced.
    fn commit(
        &self,
        temp: NamedTempFile,
        namespace: Namespace,
        path: &Path,
        len: u64,
    ) -> io::Result<()> {
        if let Some(shard) = path.parent() {
            if let Some(namespace_dir) = shard.parent() {
                real_dir(namespace_dir)?;
            }
            real_dir(shard)?;
        }
        let existing = match temp.persist_noclobber(path) {
            Ok(_) => return self.count_new(len),
            Err(e) if e.error.kind() == io::ErrorKind::AlreadyExists => e.file,
            Err(e) => return Err(annotate(e.error, "cannot store", path)),
        };
        if let Namespace::Cas = namespace
            && fs::symlink_metadata(path).is_ok_and(|m| m.is_file() && m.len() == len)
        {
            touch_path(path);
            return Ok(());
        }
        existing
            .persist(path)
            .map(drop)
            .map_err(|e| annotate(e.error, "cannot store", path))
    }

    /// Adds `len` bytes to what this process has stored, and brings the shared total up to date
    /// once that reaches 1/16 of the bound: close enough without taking the lock on every store.
    fn count_new(&self, len: u64) -> io::Result<()> {
        let pending = self.unflushed.fetch_add(len, Ordering::Relaxed) + len;
        if pending > self.max_bytes / 16 {
            self.trim()?;
        }
        Ok(())
    }

    /// Whether blob `digest` is present with its size, marking it used if so. A blob with the
    /// wrong size is deleted.
    fn has_blob(&self, digest: &Digest) -> io::Result<bool> {
        if is_empty_blob(digest) {
            return Ok(true);
        }
        let Some(path) = self.entry_path(Namespace::Cas, digest) else {
            return Ok(false);
        };
        match fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_file() && meta.len() == digest::size(digest) => {
                touch_path(&path);
                Ok(true)
            }
            Ok(_) => {
                remove_entry(&path);
                Ok(false)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(annotate(e, "cannot inspect", &path)),
        }
    }

    /// `DIR/<namespace>/<2 hex>/<hash>`, or None for a malformed digest (which could otherwise
    /// name a path outside the cache). A shard that is not a real directory (a planted symlink) is
    /// removed, so that the entry reads as missing and is stored afresh.
    fn entry_path(&self, namespace: Namespace, digest: &Digest) -> Option<PathBuf> {
        if !digest::is_valid(digest) {
            return None;
        }
        let shard = self.root.join(namespace.dir_name()).join(&digest.hash[..2]);
        if fs::symlink_metadata(&shard).is_ok_and(|m| !m.is_dir()) {
            tracing::warn!(shard = %shard.display(), "disk cache: removing what is not a directory");
            let _ = fs::remove_file(&shard);
        }
        Some(shard.join(&digest.hash))
    }

    /// Adds the unflushed bytes to `DIR/size` under the lock and, if `evict` and the total is
    /// over the bound or unknown, replaces it with the exact total after evicting.
    fn update_total(&self, evict: bool) -> io::Result<()> {
        let lock_path = self.root.join("lock");
        let lock = platform::open_no_follow(
            platform::private_file(File::options().create(true).truncate(false).write(true)),
            &lock_path,
        )
        .map_err(|e| annotate(e, "cannot open", &lock_path))?;
        lock.lock()
            .map_err(|e| annotate(e, "cannot lock", &lock_path))?;
        let size_path = self.root.join("size");
        let pending = self.unflushed.swap(0, Ordering::Relaxed);
        let total = read_file(&size_path)
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .and_then(|text| text.trim().parse::<u64>().ok())
            .map(|total| total.saturating_add(pending));
        let outcome = match total {
            Some(total) if total <= self.max_bytes || !evict => Ok(total),
            _ if evict => self.evict(),
            // Unknown and no scan wanted: leave it unknown so that the next trim scans.
            _ => return Ok(()),
        };
        let written = outcome.and_then(|total| self.replace_size(&size_path, total));
        if written.is_err() {
            // An unknown total makes the next trim scan, which recounts everything.
            let _ = fs::remove_file(&size_path);
        }
        written.map_err(|e| annotate(e, "cannot update the size of", &self.root))
    }

    /// Writes the size total to a temporary file and renames it over `DIR/size`, so that a symlink
    /// planted there is replaced, never written through.
    fn replace_size(&self, size_path: &Path, total: u64) -> io::Result<()> {
        let mut temp = self.temp_file()?;
        temp.write_all(total.to_string().as_bytes())?;
        temp.persist(size_path).map(drop).map_err(|e| e.error)
    }

    /// Scans every entry, deletes the least recently used until the rest fit in 90% of the
    /// bound, cleans junk and stale temporary files, and returns the bytes left.
    fn evict(&self) -> io::Result<u64> {
        let mut entries = Vec::new();
        for namespace in Namespace::ALL {
            scan_namespace(&self.root.join(namespace.dir_name()), &mut entries)?;
        }
        remove_stale_temps(&self.root.join("tmp"));
        let mut total: u64 = entries.iter().map(|e| e.len).sum();
        if total <= self.max_bytes {
            return Ok(total);
        }
        let target = self.max_bytes - self.max_bytes / 10;
        tracing::info!(
            total,
            bound = self.max_bytes,
            "disk cache: over its bound, evicting"
        );
        entries.sort_by_key(|e| e.used);
        for entry in entries {
            if total <= target {
                break;
            }
            match fs::symlink_metadata(&entry.path) {
                // Used (or rewritten) since the scan: it is no longer among the oldest.
                Ok(meta) if meta.modified().ok() != Some(entry.used) => continue,
                Ok(_) => match fs::remove_file(&entry.path) {
                    Ok(()) => total -= entry.len,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => total -= entry.len,
                    Err(e) => return Err(annotate(e, "cannot evict", &entry.path)),
                },
                Err(_) => total -= entry.len,
            }
        }
        Ok(total)
    }
}

impl Drop for DiskCache {
    /// Records what this process stored, so that other processes' trims count it.
    fn drop(&mut self) {
        if self.unflushed.load(Ordering::Relaxed) > 0 {
            let _ = self.update_total(false);
        }
    }
}

/// Parses a `--disk-cache-max-size` value: a byte count with an optional fraction and unit,
/// `K`, `M`, `G`, `T` (and `KB`, ...) in powers of 1000, `Ki`, `Mi`, `Gi`, `Ti` (and `KiB`, ...)
/// in powers of 1024: `500M`, `10G`, `1.5GiB`, `1048576`. Zero is refused: a cache that can hold
/// nothing is a configuration mistake.
pub fn parse_size(s: &str) -> Result<u64, String> {
    match parse_size::parse_size(s.trim()) {
        Ok(0) => Err(format!("cache size `{s}` must be greater than zero")),
        Ok(n) => Ok(n),
        Err(e) => Err(format!(
            "invalid cache size `{s}` ({e}): expected a number of bytes with an optional unit, \
             like 500M, 10G or 1.5GiB"
        )),
    }
}

/// Every blob digest an action result refers to.
fn referenced_blobs(result: &ActionResult) -> impl Iterator<Item = &Digest> {
    let files = result.output_files.iter().filter_map(|f| f.digest.as_ref());
    let trees = result
        .output_directories
        .iter()
        .filter_map(|d| d.tree_digest.as_ref());
    let streams = [&result.stdout_digest, &result.stderr_digest]
        .into_iter()
        .filter_map(Option::as_ref);
    files.chain(trees).chain(streams)
}

fn is_empty_blob(d: &Digest) -> bool {
    d.size_bytes == 0 && *d == digest::of_bytes(b"")
}

/// Copies `source` to `dest` and returns the digest of what was copied.
fn copy_hashing(source: &mut impl Read, dest: &mut impl Write) -> io::Result<Digest> {
    let mut hasher = Hasher::default();
    let mut buffer = vec![0u8; COPY_BUFFER];
    loop {
        let n = match source.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buffer[..n]);
        dest.write_all(&buffer[..n])?;
    }
    dest.flush()?;
    Ok(hasher.finish())
}

/// Marks an open entry as just used. Best effort: in a cache shared read-only, or on a file
/// system that refuses, entries simply age by their creation time.
fn touch(file: &File) {
    let _ = file.set_times(FileTimes::new().set_modified(SystemTime::now()));
}

fn touch_path(path: &Path) {
    if let Ok(file) = open_file(path) {
        touch(&file);
    }
}

/// Opens a file of the cache for reading, never through a symlink.
fn open_file(path: &Path) -> io::Result<File> {
    platform::open_no_follow(File::options().read(true), path)
}

/// Reads a file of the cache, never through a symlink.
fn read_file(path: &Path) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    open_file(path)?.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Makes sure `path` is a real directory (not a symlink to one), creating it (private to this user)
/// if missing and replacing whatever else is there.
fn real_dir(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => return Ok(()),
        Ok(_) => fs::remove_file(path).map_err(|e| annotate(e, "cannot remove", path))?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(annotate(e, "cannot inspect", path)),
    }
    match platform::private_dirs().create(path) {
        Ok(()) => Ok(()),
        // Created by a concurrent process meanwhile.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(annotate(e, "cannot create", path)),
    }
}

/// Refuses a cache directory that another user owns or that group or others may write: they could
/// plant entries or symlinks in it.
fn check_private(path: &Path, meta: &fs::Metadata) -> io::Result<()> {
    let Some(problem) = super::foreign_writable(path, meta) else {
        return Ok(());
    };
    Err(io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!(
            "disk cache: {} {problem}: another user could plant wrong objects in it (`chmod go-w` \
             what is yours); use a directory of your own",
            path.display()
        ),
    ))
}

/// Deletes a damaged entry. Best effort: if it cannot be deleted it is still a miss, and a later
/// store replaces it.
fn remove_entry(path: &Path) {
    tracing::warn!(entry = %path.display(), "disk cache: removing a damaged entry");
    let _ = fs::remove_file(path);
}

/// Adds the entries under `DIR/cas` or `DIR/ac` to `entries`. Files inside the two-hex-digit
/// directories that are not named like entries are not ours and are deleted; anything else the
/// directory holds is left alone (the cache never deletes what it does not understand wholesale).
fn scan_namespace(dir: &Path, entries: &mut Vec<ScannedEntry>) -> io::Result<()> {
    let shards = match fs::read_dir(dir) {
        Ok(shards) => shards,
        // Deleted under a running cache: stores recreate what they need.
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(annotate(e, "cannot list", dir)),
    };
    for shard in shards.flatten() {
        let prefix = shard.file_name();
        let Some(prefix) = prefix.to_str().filter(|p| is_lower_hex(p, 2)) else {
            continue;
        };
        if !shard.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let Ok(files) = fs::read_dir(shard.path()) else {
            continue;
        };
        for file in files.flatten() {
            let path = file.path();
            let name = file.file_name();
            let well_named = name
                .to_str()
                .is_some_and(|n| is_lower_hex(n, 64) && n.starts_with(prefix));
            // Entries removed by another process since the listing are skipped.
            let Ok(meta) = file.metadata() else { continue };
            if !meta.is_file() {
                continue;
            }
            if !well_named {
                let _ = fs::remove_file(&path);
                continue;
            }
            entries.push(ScannedEntry {
                path,
                len: meta.len(),
                used: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            });
        }
    }
    Ok(())
}

/// Deletes files in `DIR/tmp` not written to for [`STALE_TEMP_AGE`].
fn remove_stale_temps(dir: &Path) {
    let Ok(files) = fs::read_dir(dir) else { return };
    let now = SystemTime::now();
    for file in files.flatten() {
        let stale = file
            .metadata()
            .ok()
            .filter(|m| m.is_file())
            .and_then(|m| m.modified().ok())
            .and_then(|t| now.duration_since(t).ok())
            .is_some_and(|age| age > STALE_TEMP_AGE);
        if stale {
            tracing::info!(file = %file.path().display(), "disk cache: removing a stale temporary file");
            let _ = fs::remove_file(file.path());
        }
    }
}

fn is_lower_hex(s: &str, len: usize) -> bool {
    s.len() == len
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// `e` with what was being done and to which path, keeping its kind.
fn annotate(e: io::Error, doing: &str, path: &Path) -> io::Error {
    io::Error::new(
        e.kind(),
        format!("disk cache: {doing} {}: {e}", path.display()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use bazel_remote_apis::build::bazel::remote::execution::v2::OutputFile;
    use tempfile::TempDir;

    fn open(max_bytes: u64) -> (TempDir, DiskCache) {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = DiskCache::open(dir.path(), max_bytes).expect("open");
        (dir, cache)
    }

    fn result_naming(blobs: &[&Digest]) -> ActionResult {
        ActionResult {
            output_files: blobs
                .iter()
                .enumerate()
                .map(|(i, d)| OutputFile {
                    path: format!("out{i}.o"),
                    digest: Some((*d).clone()),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn cas_path(cache: &DiskCache, d: &Digest) -> PathBuf {
        cache.entry_path(Namespace::Cas, d).expect("valid digest")
    }

    fn ac_path(cache: &DiskCache, d: &Digest) -> PathBuf {
        cache.entry_path(Namespace::Ac, d).expect("valid digest")
    }

    fn fetch(cache: &DiskCache, d: &Digest) -> Option<Vec<u8>> {
        let dest = cache.dir().join("fetched");
        let found = cache.fetch_blob(d, &dest).expect("fetch");
        assert_eq!(found, dest.exists(), "dest exists exactly on a hit");
        found.then(|| {
            let data = fs::read(&dest).expect("read fetched");
            fs::remove_file(&dest).expect("remove fetched");
            data
        })
    }

    fn set_used(path: &Path, secs_ago: u64) {
        let file = File::open(path).expect("open entry");
        let time = SystemTime::now() - Duration::from_secs(secs_ago);
        file.set_times(FileTimes::new().set_modified(time))
            .expect("set mtime");
    }

    fn recorded_total(cache: &DiskCache) -> Option<u64> {
        fs::read_to_string(cache.dir().join("size"))
            .ok()
            .map(|t| t.parse().expect("size file holds a number"))
    }

    #[test]
    fn round_trip_survives_reopen() {
        let (dir, cache) = open(DEFAULT_MAX_BYTES);
        let small = cache.store_bytes(b"hello").expect("store bytes");
        assert_eq!(small, digest::of_bytes(b"hello"));
        // Larger than the copy buffer, so copies take several reads.
        let big_data: Vec<u8> = (0..3 * COPY_BUFFER + 5).map(|i| (i % 253) as u8).collect();
        let source = dir.path().join("big.o");
        fs::write(&source, &big_data).expect("write source");
        let big = cache.store_file(&source).expect("store file");
        assert_eq!(big, digest::of_bytes(&big_data));
        let empty = digest::of_bytes(b"");
        let mut result = result_naming(&[&small, &big, &empty]);
        result.stderr_digest = Some(small.clone());
        let action = digest::of_bytes(b"action");
        cache.put_action_result(&action, &result).expect("put");
        drop(cache);

        let cache = DiskCache::open(dir.path(), DEFAULT_MAX_BYTES).expect("reopen");
        assert_eq!(cache.get_action_result(&action).expect("get"), Some(result));
        assert_eq!(fetch(&cache, &small).as_deref(), Some(&b"hello"[..]));
        assert_eq!(fetch(&cache, &big), Some(big_data));
        assert_eq!(fetch(&cache, &empty), Some(Vec::new()));
    }

    #[test]
    fn absent_and_malformed_digests_are_misses() {
        let (_dir, cache) = open(DEFAULT_MAX_BYTES);
        let unknown = digest::of_bytes(b"never stored");
        assert_eq!(cache.get_action_result(&unknown).expect("get"), None);
        assert_eq!(fetch(&cache, &unknown), None);
        let escaping = Digest {
            hash: "../../../../etc/passwd".into(),
            size_bytes: 1,
        };
        assert_eq!(cache.get_action_result(&escaping).expect("get"), None);
        assert_eq!(fetch(&cache, &escaping), None);
        let err = cache
            .put_action_result(&escaping, &ActionResult::default())
            .expect_err("a malformed action digest is refused");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn corrupt_blob_is_a_miss_and_deleted() {
        let (_dir, cache) = open(DEFAULT_MAX_BYTES);
        let d = cache.store_bytes(b"hello world").expect("store");
        let path = cas_path(&cache, &d);
        // Same size, different content: only the hash can tell.
        fs::write(&path, b"hellO world").expect("corrupt");
        assert_eq!(fetch(&cache, &d), None);
        assert!(!path.exists(), "the corrupt entry is deleted");
        // Storing it again repairs the cache.
        cache.store_bytes(b"hello world").expect("store again");
        assert_eq!(fetch(&cache, &d).as_deref(), Some(&b"hello world"[..]));
    }

    #[test]
    fn wrong_size_blob_makes_the_action_a_miss() {
        let (_dir, cache) = open(DEFAULT_MAX_BYTES);
        let d = cache.store_bytes(b"object code").expect("store");
        let action = digest::of_bytes(b"action");
        cache
            .put_action_result(&action, &result_naming(&[&d]))
            .expect("put");
        let path = cas_path(&cache, &d);
        fs::write(&path, b"object").expect("truncate");
        assert_eq!(cache.get_action_result(&action).expect("get"), None);
        assert!(!path.exists(), "the wrong-size entry is deleted");
    }

    #[test]
    fn partial_eviction_makes_the_action_a_miss() {
        let (_dir, cache) = open(DEFAULT_MAX_BYTES);
        let a = cache.store_bytes(b"first output").expect("store a");
        let b = cache.store_bytes(b"second output").expect("store b");
        let action = digest::of_bytes(b"action");
        let result = result_naming(&[&a, &b]);
        cache.put_action_result(&action, &result).expect("put");
        assert!(cache.get_action_result(&action).expect("get").is_some());
        fs::remove_file(cas_path(&cache, &b)).expect("evict b");
        assert_eq!(cache.get_action_result(&action).expect("get"), None);
        cache.store_bytes(b"second output").expect("store b again");
        assert_eq!(cache.get_action_result(&action).expect("get"), Some(result));
    }

    #[test]
    fn unreadable_action_results_are_misses_and_deleted() {
        let (_dir, cache) = open(DEFAULT_MAX_BYTES);
        let garbage = digest::of_bytes(b"garbage");
        let path = ac_path(&cache, &garbage);
        fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        fs::write(&path, [0xff, 0xff, 0xff, 0x07, 0x01]).expect("write garbage");
        assert_eq!(cache.get_action_result(&garbage).expect("get"), None);
        assert!(!path.exists());

        // Decodes, but names a blob by a digest that is not one.
        let bad_ref = digest::of_bytes(b"bad reference");
        let malformed = Digest {
            hash: "not hex".into(),
            size_bytes: 3,
        };
        cache
            .put_action_result(&bad_ref, &result_naming(&[&malformed]))
            .expect("put");
        assert_eq!(cache.get_action_result(&bad_ref).expect("get"), None);
        assert!(!ac_path(&cache, &bad_ref).exists());
    }

    #[test]
    fn trim_evicts_least_recently_used_first() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = DiskCache::open(dir.path(), 3000).expect("open bounded");
        // Another instance with a larger bound (another link) fills the cache.
        let blobs: Vec<Digest> = {
            let filler = DiskCache::open(dir.path(), DEFAULT_MAX_BYTES).expect("open");
            let blobs: Vec<Digest> = (0..4u8)
                .map(|i| filler.store_bytes(&[i; 1000]).expect("store"))
                .collect();
            // Stored oldest first; then blob 0 is used, which makes blob 1 the oldest.
            for (i, d) in blobs.iter().enumerate() {
                set_used(&cas_path(&filler, d), 400 - 100 * i as u64);
            }
            assert!(fetch(&filler, &blobs[0]).is_some());
            blobs
            // Dropping the filler records its 4000 bytes in the shared total.
        };
        assert_eq!(recorded_total(&cache), Some(4000));
        cache.trim().expect("trim");
        // Down to 90% of the bound: the two least recently used go.
        let present: Vec<bool> = blobs.iter().map(|d| cas_path(&cache, d).exists()).collect();
        assert_eq!(present, [true, false, false, true]);
        assert_eq!(recorded_total(&cache), Some(2000));
        drop(cache);
        // Opening with a lower bound trims at once.
        let smaller = DiskCache::open(dir.path(), 1500).expect("open smaller");
        assert_eq!(recorded_total(&smaller), Some(1000));
        assert!(
            cas_path(&smaller, &blobs[0]).exists(),
            "the most recently used stays"
        );
    }

    #[test]
    fn stores_past_the_bound_trim_without_being_asked() {
        let (_dir, cache) = open(10_000);
        let blobs: Vec<Digest> = (0..30u8)
            .map(|i| cache.store_bytes(&[i; 1000]).expect("store"))
            .collect();
        let present = blobs
            .iter()
            .filter(|d| cas_path(&cache, d).exists())
            .count();
        assert!((9..=10).contains(&present), "{present} blobs kept");
        assert!(
            cas_path(&cache, &blobs[29]).exists(),
            "the newest blob is kept"
        );
    }

    #[test]
    fn the_total_counts_new_entries_once_and_trim_scans_only_when_needed() {
        let (_dir, cache) = open(1 << 20);
        let d = cache.store_bytes(&[7; 100]).expect("store");
        cache
            .store_bytes(&[7; 100])
            .expect("store the same blob again");
        let action = digest::of_bytes(b"action");
        let result = result_naming(&[&d]);
        cache.put_action_result(&action, &result).expect("put");
        cache.trim().expect("trim");
        let ac_len = result.encoded_len() as u64;
        assert_eq!(recorded_total(&cache), Some(100 + ac_len));

        // Under the bound, trim does not scan: a junk file in the layout survives it...
        let junk = cas_path(&cache, &d).with_file_name("junk");
        fs::write(&junk, b"junk").expect("write junk");
        cache.trim().expect("trim");
        assert!(junk.exists());
        // ...until the total is unknown, which forces a scan that recounts and cleans.
        fs::write(cache.dir().join("size"), "garbage").expect("corrupt the total");
        cache.trim().expect("trim");
        assert!(!junk.exists());
        assert_eq!(recorded_total(&cache), Some(100 + ac_len));
    }

    #[test]
    fn scans_remove_stale_temporary_files_only() {
        let (_dir, cache) = open(1 << 20);
        let stale = cache.dir().join("tmp").join("stale");
        let fresh = cache.dir().join("tmp").join("fresh");
        fs::write(&stale, b"left by a crash").expect("write");
        fs::write(&fresh, b"being written").expect("write");
        set_used(&stale, 2 * STALE_TEMP_AGE.as_secs());
        fs::remove_file(cache.dir().join("size")).expect("forget the total");
        cache.trim().expect("trim (an unknown total: scans)");
        assert!(!stale.exists());
        assert!(fresh.exists());
    }

    #[test]
    fn a_cache_deleted_while_open_keeps_working() {
        let (_dir, cache) = open(1 << 20);
        for sub in ["cas", "ac", "tmp"] {
            fs::remove_dir_all(cache.dir().join(sub)).expect("rm -rf");
        }
        fs::remove_file(cache.dir().join("size")).expect("rm size");
        cache.trim().expect("trim a cache with nothing in it");
        let d = cache.store_bytes(b"after").expect("store");
        let action = digest::of_bytes(b"action");
        let result = result_naming(&[&d]);
        cache.put_action_result(&action, &result).expect("put");
        assert_eq!(cache.get_action_result(&action).expect("get"), Some(result));
    }

    #[test]
    fn default_dir_is_named_after_the_program() {
        let dir = DiskCache::default_dir().expect("this platform has a cache directory");
        assert!(dir.ends_with("dtlto-reapi/disk-cache"), "{}", dir.display());
    }

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert_eq!(parse_size("500M"), Ok(500_000_000));
        assert_eq!(parse_size("10G"), Ok(10_000_000_000));
        assert_eq!(parse_size("10GiB"), Ok(10 << 30));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size(" 2KiB "), Ok(2048));
        for bad in ["", "0", "0G", "-1", "ten", "10X", "1e999", "99999999999T"] {
            assert!(parse_size(bad).is_err(), "{bad:?} should be refused");
        }
    }
}
