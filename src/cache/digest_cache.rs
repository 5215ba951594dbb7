//! A persistent map from a file's identity on disk to its content digest (and, for bitcode, its LLVM
//! module hash), so that files that do not change between links — the 185 MB compiler, the link's
//! input objects — are hashed, or even opened, once, not on every link.
//!
//! A file is known by its path, device, inode (on Windows: volume serial number and file index), size,
//! modification time and status-change time (`platform::Stamp`): any
//! write, truncation, rename over it or `touch` changes one of them. Files modified within
//! [`RACY_WINDOW`] of being read are not remembered, since a write in the same timestamp tick would
//! go unseen. As in git's index, "within" is measured by the clock of the file system the file is on,
//! not this machine's (an NFS or SMB server's clock may be off by minutes): by the time of a file
//! written there just before, the cache's own probe file or one the caller names (lld's job file).
//! Files on a file system without such a file are judged by this machine's clock.
//!
//! The cache file is trusted like the disk cache's directory: when it, or its directory, belongs to
//! another user or can be written by group or others, it is neither read nor written (another user
//! could make it name wrong contents for files), and [`DigestCache::untrusted`] says why, once.
//!
//! The map is one text file. Links running at once each load it, add what they hashed and write it
//! back whole (merged with what is on disk by then) under a temporary name renamed into place, so a
//! reader never sees a torn file; a concurrent writer's entries may be lost, which only costs a hash.
//! Each entry records when a link last used it (to the day), so trimming keeps the ones in use.
//!
//! Besides files, the cache remembers *derived* digests: the digest of content this program makes
//! from other content (a rewritten index shard), keyed by a hash of everything that content is a
//! function of ([`DigestCache::derived`]), so that a relink need not make it again to know its
//! digest. Their lines start with `derived`, which versions that do not know them skip.

use std::collections::HashMap;
use std::fs::{File, Metadata};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use crate::platform::{self, Stamp};
use crate::reapi::digest::{self, Digest};

/// Files changed more recently than this before they were read (by their file system's clock) are
/// hashed but not remembered. Two seconds: the coarsest timestamps in use (FAT) tick every two.
const RACY_WINDOW: Duration = Duration::from_secs(2);

/// Entries kept at most; beyond it, the least recently used are dropped.
const MAX_ENTRIES: usize = 100_000;

/// An entry's last use is recorded again (which costs a save) when it is older than this.
const USE_RESOLUTION_SECS: u64 = 24 * 60 * 60;

/// Derived digests kept at most; beyond it, the least recently used are dropped.
const MAX_DERIVED: usize = 100_000;

/// The first word of a derived digest's line.
const DERIVED: &str = "derived";

/// The first line of the file, naming its format. v1 (in `file-digests`) had no module hash nor
/// last use: such a file reads as an empty cache.
const HEADER: &str = "dtlto-reapi digest cache v2";

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

/// What is remembered of one version of a file.
#[derive(Debug, Clone, PartialEq)]
pub struct Remembered {
    pub digest: Digest,
    /// The LLVM module hash, when the file is bitcode that records one (and was read for it).
    pub module_hash: Option<[u32; 5]>,
}

impl FileKey {
    /// The key of `path` as its stamp and metadata (symlinks followed) describe it.
    pub fn new(path: &Path, (stamp, meta): &(Stamp, Metadata)) -> FileKey {
        FileKey {
            path: path.to_path_buf(),
            device: stamp.device,
            inode: stamp.inode,
            size: meta.len(),
            mtime_ns: stamp.mtime_ns,
            ctime_ns: stamp.ctime_ns,
        }
    }

    /// `device inode size mtime ctime last-used hash size module-hash path`, the module hash being
    /// 40 hex digits or `-`; the path last, since it may hold spaces.
    fn to_line(&self, entry: &Entry) -> Option<Vec<u8>> {
        let path = self.path.as_os_str().as_encoded_bytes();
        if path.contains(&b'\n') {
            return None;
        }
        let module_hash = match entry.remembered.module_hash {
            Some(words) => words.iter().map(|w| format!("{w:08x}")).collect(),
            None => "-".to_owned(),
        };
        let Remembered { digest, .. } = &entry.remembered;
        let mut line = format!(
            "{} {} {} {} {} {} {} {} {module_hash} ",
            self.device,
            self.inode,
            self.size,
            self.mtime_ns,
            self.ctime_ns,
            entry.last_used,
            digest.hash,
            digest.size_bytes
        )
        .into_bytes();
        line.extend_from_slice(path);
        line.push(b'\n');
        Some(line)
    }

    fn from_line(line: &[u8]) -> Option<(FileKey, Entry)> {
        let mut fields = line.splitn(10, |&b| b == b' ');
        let mut text = || std::str::from_utf8(fields.next()?).ok();
        let (device, inode, size) = (text()?.parse().ok()?, text()?.parse().ok()?, text()?);
        let (mtime_ns, ctime_ns) = (text()?.parse().ok()?, text()?.parse().ok()?);
        let last_used = text()?.parse().ok()?;
        let hash = text()?.to_owned();
        let size_bytes = text()?.parse().ok()?;
        let module_hash = parse_module_hash(text()?)?;
        let path = PathBuf::from(platform::os_string_from_bytes(fields.next()?.to_vec()));
        let digest = Digest { hash, size_bytes };
        let size: u64 = size.parse().ok()?;
        let valid = digest::is_valid(&digest) && digest::size(&digest) == size;
        let key = FileKey {
            path,
            device,
            inode,
            size,
            mtime_ns,
            ctime_ns,
        };
        let remembered = Remembered {
            digest,
            module_hash,
        };
        let entry = Entry {
            remembered,
            last_used,
        };
        valid.then_some((key, entry))
    }
}

/// `-` (none: Some(None)) or 40 hex digits; None when malformed.
fn parse_module_hash(text: &str) -> Option<Option<[u32; 5]>> {
    if text == "-" {
        return Some(None);
    }
    if text.len() != 40 || !text.is_ascii() {
        return None;
    }
    let mut words = [0u32; 5];
    for (i, word) in words.iter_mut().enumerate() {
        *word = u32::from_str_radix(&text[i * 8..i * 8 + 8], 16).ok()?;
    }
    Some(Some(words))
}

#[derive(Debug)]
struct Entry {
    remembered: Remembered,
    /// When a link last looked it up or inserted it, in seconds since the epoch (to within
    /// [`USE_RESOLUTION_SECS`]): trimming keeps the most recently used.
    last_used: u64,
}

/// How [`DigestCache::get_or_read`] knew a file.
#[derive(Debug)]
pub struct Known {
    pub remembered: Remembered,
    /// The file's metadata: of the stat that found it in the cache, else of the handle it was read
    /// through.
    pub meta: Metadata,
    /// Taken from the cache, without opening the file.
    pub from_cache: bool,
}

/// The digest cache of one process, loaded from and saved to one file.
#[derive(Debug)]
pub struct DigestCache {
    /// None: remembered by this process only (the system has no user cache directory).
    file: Option<PathBuf>,
    entries: Mutex<HashMap<FileKey, Entry>>,
    /// Derived digests by the hex hash of what they derive from.
    derived: Mutex<HashMap<String, Entry>>,
    /// Something was inserted or its use recorded since loading: [`DigestCache::save`] has work.
    changed: AtomicBool,
    /// This process's clock, in seconds since the epoch, for `last_used`.
    now: u64,
    /// Why the cache file is ignored, when it is.
    untrusted: Option<String>,
    /// Per device, a time (ns since the epoch) known to have passed on that file system's clock.
    clocks: Mutex<HashMap<u64, i64>>,
}

impl DigestCache {
    /// `<user cache dir>/dtlto-reapi/file-digests-v2`: named after the format, so that a version of
    /// dtlto-reapi that knows another format, running on the same machine (during an upgrade),
    /// does not replace this one's file with its own at every link.
    pub fn default_file() -> Option<PathBuf> {
        dirs::cache_dir().map(|d| d.join("dtlto-reapi").join("file-digests-v2"))
    }

    /// Loads the cache kept in `file`; a missing, unreadable or foreign-format file is an empty
    /// cache, and malformed lines are skipped. A file that another user could have written is not
    /// used at all (see [`DigestCache::untrusted`]).
    pub fn open(file: Option<PathBuf>) -> DigestCache {
        let untrusted = file.as_deref().and_then(untrusted);
        let file = file.filter(|_| untrusted.is_none());
        let (entries, derived) = file
            .as_ref()
            .and_then(|file| std::fs::read(file).ok())
            .map(|bytes| parse(&bytes))
            .unwrap_or_default();
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        DigestCache {
            file,
            entries: Mutex::new(entries),
            derived: Mutex::new(derived),
            changed: AtomicBool::new(false),
            now,
            untrusted,
            clocks: Mutex::new(HashMap::new()),
        }
    }

    /// Why the cache file is ignored (another user's, or in a directory others may write), for the
    /// caller to warn about once; the link goes on hashing its inputs.
    pub fn untrusted(&self) -> Option<&str> {
        self.untrusted.as_deref()
    }

    /// Tells the cache that `path` was written just before this process started (lld's job file):
    /// its modification time is a time its file system's clock has reached.
    pub fn written_now(&self, path: &Path) {
        if let Ok((stamp, _)) = platform::stamp_path(path) {
            self.observe_clock(stamp.device, stamp.mtime_ns);
        }
    }

    fn observe_clock(&self, device: u64, time_ns: i64) {
        if let Ok(mut clocks) = self.clocks.lock() {
            let known = clocks.entry(device).or_insert(time_ns);
            *known = (*known).max(time_ns);
        }
    }

    /// A time the clock of the file system on `device` has reached, in ns since the epoch: from a
    /// file written there (the first time it is needed, a probe file beside the cache file), else
    /// this machine's clock.
    fn file_system_now(&self, device: u64) -> i64 {
        let known = |cache: &DigestCache| cache.clocks.lock().ok()?.get(&device).copied();
        if let Some(time) = known(self) {
            return time;
        }
        if let Some(dir) = self.file.as_deref().and_then(Path::parent)
            && let Some(probe) = probe_time(dir)
            && probe.0 == device
        {
            self.observe_clock(probe.0, probe.1);
            return probe.1;
        }
        let local = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH);
        local.map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
    }

    /// Whether the file `key` describes changed (content or status) within [`RACY_WINDOW`] of now by
    /// its file system's clock, or in that clock's future: a write in the same timestamp tick as the
    /// hashing would then go unnoticed.
    fn racy(&self, key: &FileKey) -> bool {
        let window = RACY_WINDOW.as_nanos() as i64;
        // The status-change time too, which `touch -m` cannot set back.
        key.mtime_ns.max(key.ctime_ns) > self.file_system_now(key.device) - window
    }

    /// What is remembered of `path`, if it has not changed since.
    fn lookup(&self, path: &Path, stamped: &(Stamp, Metadata)) -> Option<Remembered> {
        let mut entries = self.entries.lock().ok()?;
        let entry = entries.get_mut(&FileKey::new(path, stamped))?;
        if entry.last_used + USE_RESOLUTION_SECS <= self.now {
            entry.last_used = self.now;
            self.changed.store(true, Ordering::Relaxed);
        }
        Some(entry.remembered.clone())
    }

    /// What `path` holds: remembered (one `stat`), or found by `read` through one open handle
    /// (given the metadata of that `stat`) and remembered when the file did not change while it
    /// was read, nor within [`RACY_WINDOW`] before.
    pub fn get_or_read(
        &self,
        path: &Path,
        read: impl FnOnce(&File, &Metadata) -> std::io::Result<Remembered>,
    ) -> std::io::Result<Known> {
        let before = platform::stamp_path(path)?;
        if let Some(remembered) = self.lookup(path, &before) {
            return Ok(Known {
                remembered,
                meta: before.1,
                from_cache: true,
            });
        }
        let file = File::open(path)?;
        let remembered = read(&file, &before.1)?;
        // The handle's own metadata: a file renamed over `path` meanwhile shows another inode.
        let after = platform::stamp_file(&file)?;
        let key = FileKey::new(path, &after);
        if key == FileKey::new(path, &before) && !self.racy(&key) {
            self.insert(key, remembered.clone());
        }
        Ok(Known {
            remembered,
            meta: after.1,
            from_cache: false,
        })
    }

    /// The digest of the file at `path` and its metadata: remembered, or hashed and remembered.
    pub fn digest_of(&self, path: &Path) -> std::io::Result<(Digest, Metadata)> {
        let known = self.get_or_read(path, |file, _| {
            Ok(Remembered {
                digest: digest::of_reader(file)?,
                module_hash: None,
            })
        })?;
        Ok((known.remembered.digest, known.meta))
    }

    /// The digest remembered for content derived from what `key` (64 hex digits: a SHA-256 of
    /// everything the content is a function of, the deriving code's version included) names.
    pub fn derived(&self, key: &str) -> Option<Digest> {
        let mut derived = self.derived.lock().ok()?;
        let entry = derived.get_mut(key)?;
        if entry.last_used + USE_RESOLUTION_SECS <= self.now {
            entry.last_used = self.now;
            self.changed.store(true, Ordering::Relaxed);
        }
        Some(entry.remembered.digest.clone())
    }

    /// Remembers `digest` as that of the content derived from what `key` names.
    pub fn remember_derived(&self, key: String, digest: Digest) {
        if let Ok(mut derived) = self.derived.lock() {
            let remembered = Remembered {
                digest,
                module_hash: None,
            };
            derived.insert(
                key,
                Entry {
                    remembered,
                    last_used: self.now,
                },
            );
            self.changed.store(true, Ordering::Relaxed);
        }
    }

    /// Remembers `remembered` as the content of the file version `key` describes.
    fn insert(&self, key: FileKey, remembered: Remembered) {
        if let Ok(mut entries) = self.entries.lock() {
            let entry = Entry {
                remembered,
                last_used: self.now,
            };
            entries.insert(key, entry);
            self.changed.store(true, Ordering::Relaxed);
        }
    }

    /// Writes the cache back, merged with entries other processes saved meanwhile: to a temporary
    /// file beside it, renamed into place. Nothing is written when nothing changed.
    pub fn save(&self) -> std::io::Result<()> {
        if !self.changed.swap(false, Ordering::Relaxed) {
            return Ok(());
        }
        let (Some(file), Ok(mut entries), Ok(mut derived)) =
            (&self.file, self.entries.lock(), self.derived.lock())
        else {
            return Ok(());
        };
        if let Ok(bytes) = std::fs::read(file) {
            let (saved_entries, saved_derived) = parse(&bytes);
            merge(&mut entries, saved_entries);
            merge(&mut derived, saved_derived);
        }
        let kept = most_recently_used(&entries, MAX_ENTRIES);
        let dir = file.parent().unwrap_or(Path::new("."));
        create_private_dir(dir)?;
        let mut out = std::io::BufWriter::new(tempfile::NamedTempFile::new_in(dir)?);
        writeln!(out, "{HEADER}")?;
        for (key, entry) in kept {
            if let Some(line) = key.to_line(entry) {
                out.write_all(&line)?;
            }
        }
        for (key, entry) in most_recently_used(&derived, MAX_DERIVED) {
            let Digest { hash, size_bytes } = &entry.remembered.digest;
            writeln!(
                out,
                "{DERIVED} {key} {} {hash} {size_bytes}",
                entry.last_used
            )?;
        }
        let tmp = out.into_inner().map_err(|e| e.into_error())?;
        tmp.persist(file).map_err(|e| e.error)?;
        Ok(())
    }
}

/// The file entries and the derived digests of a cache file.
type Parsed = (HashMap<FileKey, Entry>, HashMap<String, Entry>);

fn parse(bytes: &[u8]) -> Parsed {
    let mut lines: Vec<&[u8]> = bytes.split(|&b| b == b'\n').collect();
    // Empty after the final newline; a line cut short (no newline) is never trusted.
    lines.pop();
    let mut parsed = Parsed::default();
    if lines.first() != Some(&HEADER.as_bytes()) {
        return parsed;
    }
    for line in &lines[1..] {
        if let Some(rest) = line.strip_prefix(DERIVED.as_bytes()) {
            if let Some((key, entry)) = derived_from_line(rest) {
                parsed.1.insert(key, entry);
            }
        } else if let Some((key, entry)) = FileKey::from_line(line) {
            parsed.0.insert(key, entry);
        }
    }
    parsed
}

/// ` <key> <last-used> <hash> <size>` (after the `derived` word).
fn derived_from_line(rest: &[u8]) -> Option<(String, Entry)> {
    let text = std::str::from_utf8(rest).ok()?;
    let mut fields = text.strip_prefix(' ')?.split(' ');
    let key = fields.next()?;
    let last_used = fields.next()?.parse().ok()?;
    let hash = fields.next()?.to_owned();
    let size_bytes = fields.next()?.parse().ok()?;
    let digest = Digest { hash, size_bytes };
    let valid = fields.next().is_none()
        && key.len() == 64
        && key.bytes().all(|b| b.is_ascii_hexdigit())
        && digest::is_valid(&digest);
    let remembered = Remembered {
        digest,
        module_hash: None,
    };
    valid.then(|| {
        let entry = Entry {
            remembered,
            last_used,
        };
        (key.to_owned(), entry)
    })
}

/// Adds to `entries` what another process saved meanwhile (the later use of each wins).
fn merge<K: std::hash::Hash + Eq>(entries: &mut HashMap<K, Entry>, saved: HashMap<K, Entry>) {
    for (key, saved) in saved {
        let entry = entries.entry(key).or_insert(Entry {
            remembered: saved.remembered,
            last_used: 0,
        });
        entry.last_used = entry.last_used.max(saved.last_used);
    }
}

/// At most `max` of `entries`, the most recently used.
fn most_recently_used<K>(entries: &HashMap<K, Entry>, max: usize) -> Vec<(&K, &Entry)> {
    let mut kept: Vec<(&K, &Entry)> = entries.iter().collect();
    if kept.len() > max {
        kept.sort_unstable_by_key(|(_, entry)| std::cmp::Reverse(entry.last_used));
        kept.truncate(max);
    }
    kept
}

/// Creates `dir` (and its missing parents) private to this user.
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    platform::private_dirs().recursive(true).create(dir)
}

/// The device of `dir` and the modification time (ns since the epoch) of a file written there now:
/// where the cache file lives, the time by that file system's own clock.
fn probe_time(dir: &Path) -> Option<(u64, i64)> {
    create_private_dir(dir).ok()?;
    let probe = tempfile::NamedTempFile::new_in(dir).ok()?;
    probe.as_file().write_all(b"x").ok()?;
    let (stamp, _) = platform::stamp_file(probe.as_file()).ok()?;
    Some((stamp.device, stamp.mtime_ns))
}

/// Why the cache file `file` must not be used, if so: it, or its directory, belongs to another user
/// or may be written by group or others.
fn untrusted(file: &Path) -> Option<String> {
    let dir = file.parent().unwrap_or(Path::new("."));
    // Symlinks followed: what they lead to is what is read.
    let problem = [dir, file].into_iter().find_map(|path| {
        let problem = super::foreign_writable(path, &std::fs::metadata(path).ok()?)?;
        Some((path, problem))
    })?;
    Some(format!(
        "digest cache {}: {} {}: another user could make it name wrong contents for files, so it \
         is not used (inputs are hashed); `chmod go-w` what is yours, or remove it",
        file.display(),
        problem.0.display(),
        problem.1
    ))
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    fn remembered(bytes: &[u8], module_hash: Option<[u32; 5]>) -> Remembered {
        Remembered {
            digest: digest::of_bytes(bytes),
            module_hash,
        }
    }

    #[test]
    fn remembers_across_processes_and_forgets_changed_files() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("cache/file-digests");
        let file = dir.path().join("compiler with spaces");
        std::fs::write(&file, b"abc").unwrap();
        let meta = platform::stamp_path(&file).unwrap();

        // A file that just changed is hashed but not remembered.
        let cache = DigestCache::open(Some(store.clone()));
        assert_eq!(cache.digest_of(&file).unwrap().0, digest::of_bytes(b"abc"));
        assert!(cache.lookup(&file, &meta).is_none());

        // What is inserted is saved and found by the next process, for this file version only.
        cache.insert(FileKey::new(&file, &meta), remembered(b"abc", None));
        cache.save().unwrap();
        let again = DigestCache::open(Some(store.clone()));
        assert_eq!(again.lookup(&file, &meta), Some(remembered(b"abc", None)));
        assert!(again.lookup(&dir.path().join("elsewhere"), &meta).is_none());
        let known = again.get_or_read(&file, |_, _| panic!("read")).unwrap();
        assert!(known.from_cache);
        std::fs::write(&file, b"abd").unwrap();
        let changed = platform::stamp_path(&file).unwrap();
        assert!(again.lookup(&file, &changed).is_none());
        assert_eq!(again.digest_of(&file).unwrap().0, digest::of_bytes(b"abd"));
        // Just changed: read again each time, never served from the cache.
        let known = again.get_or_read(&file, |file, meta| {
            assert_eq!(meta.len(), 3);
            Ok(remembered(
                &std::io::read_to_string(file)?.into_bytes(),
                None,
            ))
        });
        assert!(!known.unwrap().from_cache);

        // Saving merges with what another process saved meanwhile.
        let other = DigestCache::open(Some(store.clone()));
        other.insert(FileKey::new(&file, &changed), remembered(b"abd", None));
        other.save().unwrap();
        again.save().unwrap();
        let merged = DigestCache::open(Some(store));
        assert!(merged.lookup(&file, &meta).is_some());
        assert!(merged.lookup(&file, &changed).is_some());
    }

    #[test]
    fn derived_digests_survive_a_round_trip_and_older_readers_skip_them() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("digests");
        let key = "ab".repeat(32);
        let cache = DigestCache::open(Some(file.clone()));
        assert_eq!(cache.derived(&key), None);
        cache.remember_derived(key.clone(), digest::of_bytes(b"rewritten"));
        cache.save().unwrap();
        let again = DigestCache::open(Some(file.clone()));
        assert_eq!(again.derived(&key), Some(digest::of_bytes(b"rewritten")));
        // A line of a kind this version does not know is skipped, as older ones skip `derived`.
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(FileKey::from_line(text.lines().nth(1).unwrap().as_bytes()).is_none());
        std::fs::write(&file, format!("{text}derived {key} 1 not-a-hash 9\n")).unwrap();
        assert_eq!(
            DigestCache::open(Some(file)).derived(&key),
            Some(digest::of_bytes(b"rewritten"))
        );
    }

    #[test]
    fn module_hashes_survive_a_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("file-digests");
        let (a, b) = (dir.path().join("a.o"), dir.path().join("b.o"));
        std::fs::write(&a, b"bitcode").unwrap();
        std::fs::write(&b, b"other").unwrap();
        let (meta_a, meta_b) = (
            platform::stamp_path(&a).unwrap(),
            platform::stamp_path(&b).unwrap(),
        );
        let hash = [0, 1, 0xdead_beef, u32::MAX, 0x0123_4567];
        let cache = DigestCache::open(Some(store.clone()));
        cache.insert(
            FileKey::new(&a, &meta_a),
            remembered(b"bitcode", Some(hash)),
        );
        cache.insert(FileKey::new(&b, &meta_b), remembered(b"other", None));
        cache.save().unwrap();
        let again = DigestCache::open(Some(store));
        assert_eq!(again.lookup(&a, &meta_a).unwrap().module_hash, Some(hash));
        assert_eq!(again.lookup(&b, &meta_b).unwrap().module_hash, None);
    }

    #[test]
    fn foreign_old_or_damaged_files_are_empty_caches() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("file-digests");
        let entries = |cache: &DigestCache| cache.entries.lock().unwrap().len();
        std::fs::write(&store, b"something else\n1 2 3\n").unwrap();
        assert_eq!(entries(&DigestCache::open(Some(store.clone()))), 0);
        std::fs::write(&store, [0xff, 0, 0x80, b'\n', 7]).unwrap();
        assert_eq!(entries(&DigestCache::open(Some(store.clone()))), 0);

        // A version-1 file, whose lines lack the module hash and last use, is an empty cache.
        let hash = "a".repeat(64);
        let v1 = format!("dtlto-reapi digest cache v1\n1 2 3 4 5 {hash} 3 /p\n");
        std::fs::write(&store, v1).unwrap();
        assert_eq!(entries(&DigestCache::open(Some(store.clone()))), 0);

        // Only the well-formed line whose digest size matches the file size survives: not one
        // with another size, a short or non-hex module hash, missing fields, or one cut short.
        let module = "0123456789abcdef0123456789abcdef01234567";
        let lines = format!(
            "{HEADER}\n1 2 3 4 5 6 {hash} 3 {module} /p q\n1 2 4 4 5 6 {hash} 3 - /r\n\
             1 2 3 4 5 6 {hash} 3 0123 /s\n1 2 3 4 5 6 {hash} 3 {} /t\n1 2 x\n\
             1 2 3 4 5 6 {hash} 3 - /u\n1 2 3 4 5 6 {hash} 3 - /truncated",
            "g".repeat(40)
        );
        std::fs::write(&store, lines).unwrap();
        let cache = DigestCache::open(Some(store));
        let entries = cache.entries.lock().unwrap();
        let mut paths: Vec<&Path> = entries.keys().map(|k| k.path.as_path()).collect();
        paths.sort();
        assert_eq!(paths, [Path::new("/p q"), Path::new("/u")]);
    }

    #[test]
    fn trimming_keeps_the_most_recently_used() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"abc").unwrap();
        let meta = platform::stamp_path(&file).unwrap();
        let entries: HashMap<FileKey, Entry> = (0..10u64)
            .map(|day| {
                let key = FileKey::new(&dir.path().join(day.to_string()), &meta);
                let entry = Entry {
                    remembered: remembered(b"abc", None),
                    last_used: day * USE_RESOLUTION_SECS,
                };
                (key, entry)
            })
            .collect();
        let mut kept: Vec<u64> = most_recently_used(&entries, 3)
            .iter()
            .map(|(_, e)| e.last_used / USE_RESOLUTION_SECS)
            .collect();
        kept.sort_unstable();
        assert_eq!(kept, [7, 8, 9]);
        assert_eq!(most_recently_used(&entries, 20).len(), 10);
    }

    #[test]
    fn a_lookup_records_the_use_at_most_once_a_day() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("file-digests");
        let file = dir.path().join("f");
        std::fs::write(&file, b"abc").unwrap();
        let meta = platform::stamp_path(&file).unwrap();
        let cache = DigestCache::open(Some(store.clone()));
        cache.insert(FileKey::new(&file, &meta), remembered(b"abc", None));
        cache.save().unwrap();
        // Used today: looking it up again writes nothing.
        let again = DigestCache::open(Some(store.clone()));
        assert!(again.lookup(&file, &meta).is_some());
        assert!(!again.changed.load(Ordering::Relaxed));
        // Last used long ago: the use is recorded.
        let old = std::fs::read_to_string(&store).unwrap();
        let now = format!(" {} ", cache.now);
        std::fs::write(&store, old.replacen(&now, " 1000 ", 1)).unwrap();
        let later = DigestCache::open(Some(store));
        assert!(later.lookup(&file, &meta).is_some());
        assert!(later.changed.load(Ordering::Relaxed));
    }
    #[test]
    fn recent_is_measured_by_the_file_systems_clock() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DigestCache::open(Some(dir.path().join("cache/file-digests")));
        let file = dir.path().join("input.o");
        std::fs::write(&file, b"abc").unwrap();
        let now = SystemTime::now();
        let key = |modified: SystemTime| {
            let mut key = FileKey::new(&file, &platform::stamp_path(&file).unwrap());
            let ns = modified
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as i64;
            (key.mtime_ns, key.ctime_ns) = (ns, ns);
            key
        };
        let secs = Duration::from_secs;
        // The cache's own file system (the probe beside the cache file): this machine's clock.
        assert!(cache.racy(&key(now - secs(1))));
        assert!(cache.racy(&key(now + secs(60))));
        assert!(!cache.racy(&key(now - secs(10))));

        // A file server whose clock is 60 s behind this machine's, as lld's job file written there
        // just now shows: a file it changed a second ago is recent, though this machine's clock
        // says a minute; one it changed 30 s ago is not, though this machine's clock says it
        // changed in the future.
        let server = tempfile::tempdir().unwrap();
        let job_file = server.path().join("link.dist-file.json");
        std::fs::write(&job_file, b"{}").unwrap();
        let written = std::fs::File::options()
            .write(true)
            .open(&job_file)
            .unwrap();
        written.set_modified(now - secs(60)).unwrap();
        let cache = DigestCache::open(None);
        cache.written_now(&job_file);
        assert!(cache.racy(&key(now - secs(61))));
        assert!(!cache.racy(&key(now - secs(90))));
        // And one 60 s ahead: its files changed 30 s ago are not recent.
        written.set_modified(now + secs(60)).unwrap();
        cache.written_now(&job_file);
        assert!(!cache.racy(&key(now + secs(30))));
        assert!(cache.racy(&key(now + secs(59))));
    }

    #[test]
    fn a_cache_others_could_write_is_ignored_with_a_reason() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("dtlto-reapi/file-digests");
        let file = dir.path().join("input.o");
        std::fs::write(&file, b"abc").unwrap();
        let meta = platform::stamp_path(&file).unwrap();
        let saved = DigestCache::open(Some(store.clone()));
        assert_eq!(saved.untrusted(), None);
        saved.insert(FileKey::new(&file, &meta), remembered(b"abc", None));
        saved.save().unwrap();
        // Created private to this user.
        let mode = |path: &Path| path.metadata().unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(store.parent().unwrap()), 0o700);
        let trusted = DigestCache::open(Some(store.clone()));
        assert!(trusted.lookup(&file, &meta).is_some());

        let set_mode = |path: &Path, mode: u32| {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap()
        };
        let ignored = |reason: &str| {
            let cache = DigestCache::open(Some(store.clone()));
            let why = cache
                .untrusted()
                .expect("the cache file is ignored")
                .to_owned();
            assert!(why.contains(reason), "{why}");
            assert!(why.contains(&store.display().to_string()), "{why}");
            assert!(cache.lookup(&file, &meta).is_none(), "{why}");
            // Nor is it written.
            let before = std::fs::read(&store).unwrap();
            cache.insert(FileKey::new(&file, &meta), remembered(b"abc", None));
            cache.save().unwrap();
            assert_eq!(std::fs::read(&store).unwrap(), before);
        };
        set_mode(store.parent().unwrap(), 0o777);
        ignored("writable by group or others (mode 777)");
        set_mode(store.parent().unwrap(), 0o700);
        set_mode(&store, 0o620);
        ignored("writable by group or others (mode 620)");
        set_mode(&store, 0o600);
        assert!(DigestCache::open(Some(store.clone())).untrusted().is_none());
        // Another user's file: only root can make one (as the tests run in CI).
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            std::os::unix::fs::chown(&store, Some(65534), None).unwrap();
            ignored("is owned by user 65534");
        }
    }
}
