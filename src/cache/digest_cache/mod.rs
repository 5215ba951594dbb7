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
//! The cache is a directory of [`PARTS`] *part* files, each holding the entries whose key (a
//! file's path, a derived digest's slot) hashes to it (see [`part_of`]). A part is read the first
//! time a link looks up a key of it, so a link reads the parts of its own files and its compiler,
//! not the whole cache: a one-job relink reads a few parts, however many projects the machine has
//! linked (when one file held everything, reading and indexing it cost such a relink 23 ms at
//! the cap, four times the rest of its work), while a link of thousands of files reads them all,
//! as before. Each part is kept as `part` describes: lines that carry their checksums, appended to
//! and compacted on its own.
//!
//! The directory is trusted like the disk cache's: when it, or a part file, belongs to another
//! user or can be written by group or others, it is neither read nor written (another user could
//! make it name wrong contents for files), and [`DigestCache::untrusted`] says why, once.
//!
//! lld's index shards (`*.thinlto.bc`) are never remembered: lld writes them under new names on
//! every link, so no later link could look them up, and at 50,000 modules they would be half the
//! file and, by being newer, push the link's objects out of it.
//!
//! Besides files, the cache remembers *derived* digests: the digest of content this program makes
//! from other content (a rewritten index shard), keyed by a hash of everything that content is a
//! function of ([`DigestCache::derived`]), so that a relink need not make it again to know its
//! digest. Each is kept in a *slot* that names the thing derived (one module's rewritten shard),
//! which holds its latest version only: an edit-and-relink that changes what a shard derives from
//! replaces its entry, so the dead ones of earlier versions go with the next compaction instead of
//! piling up until the cap (they made a cache of a few hundred files grow by ~100 lines per
//! relink of a heavy-import project, all read by every link). Their lines start with `derived`,
//! which versions that do not know them skip; lines of the slotless format before are skipped too.

mod part;

use std::collections::HashMap;
use std::fs::{File, Metadata};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use part::Part;

use crate::platform::{self, Stamp};
use crate::reapi::digest::{self, Digest};

/// Files changed more recently than this before they were read (by their file system's clock) are
/// hashed but not remembered. Two seconds: the coarsest timestamps in use (FAT) tick every two.
const RACY_WINDOW: Duration = Duration::from_secs(2);

/// How many parts the cache is split into. A link reads a part for each of its files until it has
/// read them all; with 256, a cache at its cap (100,000 file entries and as many derived) holds
/// some 800 lines, ~170 KB, in each part.
const PARTS: usize = 256;

/// The end of the names lld gives index shards, which are new on every link.
const INDEX_SHARD_SUFFIX: &[u8] = b".thinlto.bc";

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

    /// The part that holds this key's entries: by its path, so that every version of a file is
    /// in one part.
    fn part(&self) -> usize {
        part_of(self.path.as_os_str().as_encoded_bytes())
    }
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

/// The digest cache of one process: parts loaded from their files when first looked up, and saved
/// to them.
#[derive(Debug)]
pub struct DigestCache {
    /// The directory of the part files. None: remembered by this process only (the system has no
    /// user cache directory, or the directory is not trusted).
    dir: Option<PathBuf>,
    /// [`PARTS`] parts, each holding the entries whose keys [`part_of`] puts there.
    parts: Box<[Mutex<Part>]>,
    /// This process's clock, in seconds since the epoch, for `last_used`.
    now: u64,
    /// Why the directory, or the first part file found so, is ignored.
    untrusted: Mutex<Option<String>>,
    /// Per device, a time (ns since the epoch) known to have passed on that file system's clock.
    clocks: Mutex<HashMap<u64, i64>>,
}

impl DigestCache {
    /// `<user cache dir>/dtlto-reapi/file-digests-v4`: named after the format, so that a version of
    /// dtlto-reapi that knows another format, running on the same machine (during an upgrade),
    /// does not replace this one's files with its own at every link.
    pub fn default_dir() -> Option<PathBuf> {
        dirs::cache_dir().map(|d| d.join("dtlto-reapi").join("file-digests-v4"))
    }

    /// The cache kept in the directory `dir`, of which nothing is read yet: each part is read when
    /// a link first looks up a key of it. A missing, unreadable or foreign-format part is empty,
    /// and malformed lines are skipped. A directory or part that another user could have written
    /// is not used at all (see [`DigestCache::untrusted`]).
    pub fn open(dir: Option<PathBuf>) -> DigestCache {
        let untrusted = dir.as_deref().and_then(untrusted_dir);
        let dir = dir.filter(|_| untrusted.is_none());
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        DigestCache {
            dir,
            parts: (0..PARTS).map(|_| Mutex::default()).collect(),
            now,
            untrusted: Mutex::new(untrusted),
            clocks: Mutex::new(HashMap::new()),
        }
    }

    /// Why the cache directory, or a part file in it, is ignored (another user's, or writable by
    /// others), for the caller to warn about once; the link goes on hashing its inputs.
    pub fn untrusted(&self) -> Option<String> {
        self.untrusted.lock().ok()?.clone()
    }

    /// Part `index`, read from its file first if this process has not yet.
    fn part(&self, index: usize) -> Option<MutexGuard<'_, Part>> {
        let mut part = self.parts[index].lock().ok()?;
        if !part.loaded() {
            let file = self.dir.as_ref().map(|dir| dir.join(part_name(index)));
            if let Err(why) = part.load(file) {
                let mut untrusted = self.untrusted.lock().ok()?;
                untrusted.get_or_insert(why);
            }
        }
        Some(part)
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
    /// file written there (the first time it is needed, a probe file in the cache's directory),
    /// else this machine's clock.
    fn file_system_now(&self, device: u64) -> i64 {
        let known = |cache: &DigestCache| cache.clocks.lock().ok()?.get(&device).copied();
        if let Some(time) = known(self) {
            return time;
        }
        if let Some(dir) = self.dir.as_deref()
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
        let key = FileKey::new(path, stamped);
        self.part(key.part())?.file(&key, self.now).cloned()
    }

    /// What `path` holds: remembered (one `stat`), or found by `read` through one open handle
    /// (given the metadata of that `stat`) and remembered when the file did not change while it
    /// was read, nor within [`RACY_WINDOW`] before, and is not an index shard.
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
        let shard = path
            .as_os_str()
            .as_encoded_bytes()
            .ends_with(INDEX_SHARD_SUFFIX);
        if key == FileKey::new(path, &before) && !shard && !self.racy(&key) {
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
        let known = self.get_or_read(path, |file, meta| {
            Ok(Remembered {
                digest: digest::of_reader(file, meta.len())?,
                module_hash: None,
            })
        })?;
        Ok((known.remembered.digest, known.meta))
    }

    /// The digest remembered in `slot` for content derived from what `key` names. Both are 64
    /// hex digits (SHA-256): `key` of everything the content is a function of, the deriving
    /// code's version included; `slot` of what the content is (one module's rewritten index
    /// shard, say), whose latest version alone the slot holds.
    pub fn derived(&self, slot: &str, key: &str) -> Option<Digest> {
        let mut part = self.part(part_of(slot.as_bytes()))?;
        part.derived(slot, key, self.now).cloned()
    }

    /// Remembers `digest` as that of the content derived from what `key` names, in `slot` (see
    /// [`DigestCache::derived`]), replacing what the slot held.
    pub fn remember_derived(&self, slot: String, key: String, digest: Digest) {
        if let Some(mut part) = self.part(part_of(slot.as_bytes())) {
            part.remember_derived(slot, key, digest, self.now);
        }
    }

    /// Remembers `remembered` as the content of the file version `key` describes.
    fn insert(&self, key: FileKey, remembered: Remembered) {
        if let Some(mut part) = self.part(key.part()) {
            part.insert_file(key, remembered, self.now);
        }
    }

    /// Writes what this process added or used anew since loading, part by part (see
    /// [`Part::save`]): a relink that hashed nothing new writes nothing, one that hashed a few
    /// files writes to the few parts that hold them.
    pub fn save(&self) -> std::io::Result<()> {
        let mut result = Ok(());
        for part in &self.parts {
            if let Ok(mut part) = part.lock()
                && let Err(e) = part.save()
            {
                result = Err(e);
            }
        }
        result
    }
}

/// Which part holds the entries of `key` (a file's path, a derived digest's slot): the first byte
/// of its SHA-256, so that a script can place an entry as this program would.
fn part_of(key: &[u8]) -> usize {
    use sha2::Digest as _;
    usize::from(sha2::Sha256::digest(key)[0]) % PARTS
}

/// The file name of part `index` in the cache's directory: two hex digits.
fn part_name(index: usize) -> String {
    format!("{index:02x}")
}

/// Creates `dir` (and its missing parents) private to this user.
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    platform::private_dirs().recursive(true).create(dir)
}

/// The device of `dir` and the modification time (ns since the epoch) of a file written there now:
/// in the cache's directory, the time by that file system's own clock.
fn probe_time(dir: &Path) -> Option<(u64, i64)> {
    create_private_dir(dir).ok()?;
    let probe = tempfile::NamedTempFile::new_in(dir).ok()?;
    probe.as_file().write_all(b"x").ok()?;
    let (stamp, _) = platform::stamp_file(probe.as_file()).ok()?;
    Some((stamp.device, stamp.mtime_ns))
}

/// Why the cache directory `dir` must not be used, if so: it belongs to another user or may be
/// written by group or others, who could then put part files in it or replace them.
fn untrusted_dir(dir: &Path) -> Option<String> {
    // Symlinks followed: what they lead to is what is read.
    let problem = super::foreign_writable(dir, &std::fs::metadata(dir).ok()?)?;
    Some(distrusted(dir, &problem))
}

/// The warning for a cache directory or part file, `path`, that another user could write.
fn distrusted(path: &Path, problem: &str) -> String {
    format!(
        "digest cache {}: {problem}: another user could make it name wrong contents for files, \
         so it is not used (inputs are hashed); `chmod go-w` what is yours, or remove it",
        path.display()
    )
}

/// For tests: a scratch directory, the path of a cache directory `store` in it (not created), and
/// a file `name` in it holding `abc`, with its stamp.
#[cfg(all(test, unix))]
fn scratch(store: &str, name: &str) -> (tempfile::TempDir, PathBuf, PathBuf, (Stamp, Metadata)) {
    let dir = tempfile::tempdir().unwrap();
    let (store, file) = (dir.path().join(store), dir.path().join(name));
    std::fs::write(&file, b"abc").unwrap();
    let meta = platform::stamp_path(&file).unwrap();
    (dir, store, file, meta)
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
        let (dir, store, file, meta) = scratch("cache/file-digests", "compiler with spaces");

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
    fn index_shards_are_not_remembered() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("file-digests");
        let (shard, object) = (
            dir.path().join("m.1.4242.native.o.thinlto.bc"),
            dir.path().join("m.o"),
        );
        for path in [&shard, &object] {
            std::fs::write(path, b"abc").unwrap();
            let old = SystemTime::now() - Duration::from_secs(60);
            File::options()
                .write(true)
                .open(path)
                .unwrap()
                .set_modified(old)
                .unwrap();
        }
        let cache = DigestCache::open(Some(store.clone()));
        // Ctime cannot be set back: the clock of the file system is taken to be later.
        cache.observe_clock(platform::stamp_path(&shard).unwrap().0.device, i64::MAX / 2);
        let read = |path: &Path| {
            cache
                .get_or_read(path, |_, _| Ok(remembered(b"abc", None)))
                .unwrap()
        };
        assert!(!read(&shard).from_cache && !read(&shard).from_cache);
        assert!(!read(&object).from_cache && read(&object).from_cache);
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
    fn a_link_reads_only_the_parts_of_what_it_looks_up() {
        // Where an entry goes is pinned: scripts (bench/digest-cache.sh) place entries as this does.
        assert_eq!(part_of(b"/p"), 0x00);
        assert_eq!(part_of(b"/u"), 0x09);
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("file-digests");
        let files: Vec<(PathBuf, (Stamp, Metadata))> = (0..64)
            .map(|i| {
                let file = dir.path().join(format!("{i}.o"));
                std::fs::write(&file, i.to_string()).unwrap();
                let stamp = platform::stamp_path(&file).unwrap();
                (file, stamp)
            })
            .collect();
        let cache = DigestCache::open(Some(store.clone()));
        for (file, stamp) in &files {
            let bytes = std::fs::read(file).unwrap();
            cache.insert(FileKey::new(file, stamp), remembered(&bytes, None));
        }
        cache.save().unwrap();
        let parts: std::collections::BTreeSet<usize> = files
            .iter()
            .map(|(file, stamp)| FileKey::new(file, stamp).part())
            .collect();
        assert!(parts.len() > 32, "{parts:?}");
        let part_files = std::fs::read_dir(&store).unwrap().count();
        assert_eq!(part_files, parts.len());

        // A relink that looks up one file reads that file's part, and no other.
        let loaded = |cache: &DigestCache| {
            let parts = cache.parts.iter();
            parts.filter(|p| p.lock().unwrap().loaded()).count()
        };
        let relink = DigestCache::open(Some(store.clone()));
        assert_eq!(loaded(&relink), 0);
        let (file, stamp) = &files[0];
        let bytes = std::fs::read(file).unwrap();
        assert_eq!(relink.lookup(file, stamp), Some(remembered(&bytes, None)));
        assert_eq!(loaded(&relink), 1);
        // A link of every file reads every part they are in, and finds them all.
        let link = DigestCache::open(Some(store));
        for (file, stamp) in &files {
            assert!(link.lookup(file, stamp).is_some(), "{}", file.display());
        }
        assert_eq!(loaded(&link), parts.len());
    }

    #[test]
    fn a_cache_others_could_write_is_ignored_with_a_reason() {
        use std::os::unix::fs::PermissionsExt;
        let (_dir, store, file, meta) = scratch("dtlto-reapi/file-digests", "input.o");
        let key = FileKey::new(&file, &meta);
        let part = store.join(part_name(key.part()));
        let saved = DigestCache::open(Some(store.clone()));
        saved.insert(key.clone(), remembered(b"abc", None));
        saved.save().unwrap();
        assert_eq!(saved.untrusted(), None);
        // Created private to this user.
        let mode = |path: &Path| path.metadata().unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&store), 0o700);
        assert_eq!(mode(&part), 0o600);
        let trusted = DigestCache::open(Some(store.clone()));
        assert!(trusted.lookup(&file, &meta).is_some());
        assert_eq!(trusted.untrusted(), None);

        let set_mode = |path: &Path, mode: u32| {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap()
        };
        let ignored = |culprit: &Path, reason: &str| {
            let cache = DigestCache::open(Some(store.clone()));
            assert!(cache.lookup(&file, &meta).is_none());
            let why = cache.untrusted().expect("the cache is ignored");
            assert!(why.contains(reason), "{why}");
            assert!(why.contains(&culprit.display().to_string()), "{why}");
            // Nor is it written.
            let before = std::fs::read(&part).unwrap();
            cache.insert(key.clone(), remembered(b"abc", None));
            cache.save().unwrap();
            assert_eq!(std::fs::read(&part).unwrap(), before);
        };
        set_mode(&store, 0o777);
        ignored(&store, "writable by group or others (mode 777)");
        set_mode(&store, 0o700);
        set_mode(&part, 0o620);
        ignored(&part, "writable by group or others (mode 620)");
        set_mode(&part, 0o600);
        let again = DigestCache::open(Some(store.clone()));
        assert!(again.lookup(&file, &meta).is_some());
        assert!(again.untrusted().is_none());
        // Another user's part: only root can make one (as the tests run in CI).
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            std::os::unix::fs::chown(&part, Some(65534), None).unwrap();
            ignored(&part, "is owned by user 65534");
        }
    }
}
