//! One part of the digest cache: a text file of lines, each carrying a checksum of itself, and
//! what this process looked up, added and must save of it.
//!
//! A link reads a part whole but only indexes it (a hash of each line's key, where the line is): a
//! line is checked and parsed when the link looks its file up, so reading costs little per line.
//! A link *appends* what it added (one `write` of its new lines, in append mode), so a relink that
//! hashed nothing writes nothing, and one that hashed a few files writes a few lines. A later line
//! for the same file version supersedes an earlier one. Lines that are torn (a link killed while
//! writing, a full disk) or interleaved (appends over NFS) fail their checksum and are skipped:
//! they only cost a hash. When the part holds more than twice the lines it would need, or more
//! entries than are kept, a link *compacts* it instead: merged with what is on disk by then,
//! trimmed, written whole under a temporary name and renamed into place, so a reader never sees a
//! half-written file; a concurrent link's appends may then be lost, which only costs a hash. Each
//! entry records when a link last used it (to the day), so trimming keeps the ones in use.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};

use super::{FileKey, PARTS, Remembered, create_private_dir, distrusted};
use crate::cache::foreign_writable;
use crate::platform;
use crate::reapi::digest::{self, Digest};

/// File entries the cache keeps at most, in all its parts (unless a link uses more: see
/// [`WORKING_SETS`]); beyond a part's share, its least recently used are dropped.
const MAX_ENTRIES: usize = 100_000;

/// An entry's last use is recorded again (which costs a save) when it is older than this.
const USE_RESOLUTION_SECS: u64 = 24 * 60 * 60;

/// Derived digests the cache keeps at most, in all its parts (unless a link uses more: see
/// [`WORKING_SETS`]); beyond a part's share, its least recently used are dropped.
const MAX_DERIVED: usize = 100_000;

/// The caps grow to this many times what the link that saves used, so that a project's own
/// directory, a second checkout of it and a third fit at once: at 50,000 modules, a build directory
/// and a fresh copy of it hold 100,000 objects, and under a fixed cap of 100,000 each relink trimmed
/// away half of the other directory, to be hashed again by its next link.
const WORKING_SETS: usize = 3;

/// What a trim keeps of the cap, as a fraction: room for the next links to append before the next
/// compaction.
const TRIMMED_SHARE: (usize, usize) = (3, 4);

/// The first word of a derived digest's line.
const DERIVED: &str = "derived";

/// The first line of a part, naming its format. v1 (in `file-digests`) had no module hash nor
/// last use, v2 (in `file-digests-v2`) no checksums and was rewritten whole, v3 (in
/// `file-digests-v3`) was one file holding every part: such a file reads as an empty part.
const HEADER: &str = "dtlto-reapi digest cache v4";

/// Hex digits of each line's checksum (the start of a SHA-256 of the rest of the line).
const CHECKSUM_DIGITS: usize = 16;

/// Lines a part may hold beyond twice its entries before a save compacts it.
const COMPACT_SLACK: usize = 16;

/// One part: what this process has of it, and where it is kept.
#[derive(Debug, Default)]
pub(super) struct Part {
    /// The part's file: None before [`Part::load`], and after it when the part is remembered by
    /// this process only (no cache directory, or a file another user could write).
    file: Option<PathBuf>,
    loaded: bool,
    entries: HashMap<FileKey, Entry>,
    /// Derived digests by their slot (see [`super::DigestCache::derived`]).
    derived: HashMap<String, Derived>,
    /// The file's lines not yet looked up (and so not in `entries` or `derived`).
    unparsed: Unparsed,
    /// Lines in the file as this process last read or wrote it; None when it has no lines of this
    /// format (missing, foreign or older), so the next save writes it whole.
    lines: Option<usize>,
    /// Something was inserted or its use recorded since loading: [`Part::save`] has work.
    changed: bool,
}

impl Part {
    /// Whether [`Part::load`] ran.
    pub(super) fn loaded(&self) -> bool {
        self.loaded
    }

    /// Reads the part from `file` (None: kept by this process only). A missing or unreadable file
    /// is an empty part; one that another user could have written is neither read nor written,
    /// and the error says why.
    pub(super) fn load(&mut self, file: Option<PathBuf>) -> Result<(), String> {
        self.loaded = true;
        let Some(file) = file else { return Ok(()) };
        let Ok(mut handle) = File::open(&file) else {
            // Missing: the first save creates it.
            self.file = Some(file);
            return Ok(());
        };
        let meta = handle.metadata().map_err(|e| e.to_string())?;
        // The handle's own metadata: what it reads is what was checked.
        if let Some(problem) = foreign_writable(&file, &meta) {
            return Err(distrusted(&file, &problem));
        }
        let mut bytes = Vec::with_capacity(meta.len() as usize + 1);
        if handle.read_to_end(&mut bytes).is_ok() {
            (self.unparsed, self.lines) = Unparsed::index(bytes);
        }
        self.file = Some(file);
        Ok(())
    }

    /// What is remembered of the file version `key`, its use recorded.
    pub(super) fn file(&mut self, key: &FileKey, now: u64) -> Option<&Remembered> {
        if !self.entries.contains_key(key) {
            self.unparsed.parse_file(key, &mut self.entries);
        }
        let entry = self.entries.get_mut(key)?;
        self.changed |= entry.used(now);
        Some(&entry.remembered)
    }

    /// Remembers `remembered` as the content of the file version `key` describes.
    pub(super) fn insert_file(&mut self, key: FileKey, remembered: Remembered, now: u64) {
        self.unparsed.files.take(key.hash()).for_each(drop);
        self.entries.insert(key, Entry::new(remembered, now));
        self.changed = true;
    }

    /// The digest `slot` holds for content derived from what `key` names, its use recorded.
    pub(super) fn derived(&mut self, slot: &str, key: &str, now: u64) -> Option<&Digest> {
        if !self.derived.contains_key(slot) {
            self.unparsed.parse_derived(slot, &mut self.derived);
        }
        let found = self
            .derived
            .get_mut(slot)
            .filter(|found| found.key == key)?;
        self.changed |= found.entry.used(now);
        Some(&found.entry.remembered.digest)
    }

    /// Puts `digest` in `slot`, derived from what `key` names, replacing what the slot held.
    pub(super) fn remember_derived(&mut self, slot: String, key: String, digest: Digest, now: u64) {
        let remembered = Remembered {
            digest,
            module_hash: None,
        };
        self.unparsed
            .derived
            .take(key_hash(slot.as_bytes()))
            .for_each(drop);
        let entry = Entry::new(remembered, now);
        self.derived.insert(slot, Derived { key, entry });
        self.changed = true;
    }

    /// Writes what this process added or used anew since loading: appended to the file, or, when
    /// the file would hold more than twice the lines it needs (or more entries than are kept), the
    /// whole part merged with what other processes saved meanwhile, to a temporary file beside it
    /// renamed into place. Nothing is written when nothing changed.
    pub(super) fn save(&mut self) -> std::io::Result<()> {
        if !std::mem::take(&mut self.changed) {
            return Ok(());
        }
        let Some(file) = &self.file else {
            return Ok(());
        };
        let unsaved = (self.entries.iter().filter(|(_, e)| !e.saved))
            .filter_map(file_line)
            .chain((self.derived.iter().filter(|(_, d)| !d.entry.saved)).map(derived_line))
            .collect::<Vec<_>>();
        // Keys of lines not looked up count as one each (a hash collision makes that one fewer).
        let files = self.entries.len() + self.unparsed.files.len();
        let derived_count = self.derived.len() + self.unparsed.derived.len();
        let caps = Caps::for_link(&self.entries, &self.derived);
        let appendable = self.lines.is_some_and(|lines| {
            lines + unsaved.len() <= 2 * (files + derived_count) + COMPACT_SLACK
                && files <= caps.files
                && derived_count <= caps.derived
        });
        self.lines = if appendable && append(file, &unsaved).is_ok() {
            // And the newline the block starts with.
            self.lines
                .map(|lines| lines + unsaved.len() + usize::from(!unsaved.is_empty()))
        } else {
            Some(compact(file, &self.entries, &self.derived, caps)?)
        };
        let derived_entries = self.derived.values_mut().map(|d| &mut d.entry);
        for entry in self.entries.values_mut().chain(derived_entries) {
            entry.saved = true;
        }
        Ok(())
    }
}

impl FileKey {
    /// `device inode size mtime ctime last-used hash size module-hash path`, the module hash being
    /// 40 hex digits or `-`; the path last, since it may hold spaces. Without the checksum.
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
            "{} {} {} {} {module_hash} ",
            self.stamp_fields(),
            entry.last_used,
            digest.hash,
            digest.size_bytes
        )
        .into_bytes();
        line.extend_from_slice(path);
        Some(line)
    }

    /// The hash [`Unparsed`] indexes this key's lines by: of the stamp's fields as
    /// [`FileKey::to_line`] writes them (enough to tell file versions apart; the lines of two
    /// paths to one file are both parsed, and told apart then).
    fn hash(&self) -> u64 {
        key_hash(self.stamp_fields().as_bytes())
    }

    /// A hash of the whole key, the path included (two paths may name one file version).
    fn identity(&self) -> u64 {
        use std::hash::Hasher;
        let mut hasher = std::hash::DefaultHasher::new();
        std::hash::Hash::hash(self, &mut hasher);
        hasher.finish()
    }

    /// `device inode size mtime ctime`: how a line starts, and what its index hash is over.
    fn stamp_fields(&self) -> String {
        let FileKey {
            device,
            inode,
            size,
            mtime_ns,
            ctime_ns,
            ..
        } = self;
        format!("{device} {inode} {size} {mtime_ns} {ctime_ns}")
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
        valid.then_some((key, Entry::saved(remembered, last_used)))
    }
}

/// `line` with its checksum in front and a newline after.
fn checked(line: &[u8]) -> Vec<u8> {
    let mut checked = checksum(line).into_bytes();
    checked.push(b' ');
    checked.extend_from_slice(line);
    checked.push(b'\n');
    checked
}

/// The line after its checksum, if the checksum is right.
fn verified(line: &[u8]) -> Option<&[u8]> {
    let (sum, rest) = (line.get(..CHECKSUM_DIGITS)?, line.get(CHECKSUM_DIGITS..)?);
    let rest = rest.strip_prefix(b" ")?;
    (checksum(rest).as_bytes() == sum).then_some(rest)
}

fn checksum(line: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(&sha2::Sha256::digest(line)[..CHECKSUM_DIGITS / 2])
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

/// A derived digest in its slot: the key of what it was derived from, and the entry.
#[derive(Debug)]
struct Derived {
    key: String,
    entry: Entry,
}

#[derive(Debug)]
struct Entry {
    remembered: Remembered,
    /// When a link last looked it up or inserted it, in seconds since the epoch (to within
    /// [`USE_RESOLUTION_SECS`]): trimming keeps the most recently used.
    last_used: u64,
    /// The file holds the entry as it is: a save need not write it.
    saved: bool,
    /// This process looked it up or inserted it: trimming keeps it before any other, since
    /// [`Entry::last_used`] cannot tell apart the entries of one day.
    this_link: bool,
}

impl Entry {
    fn saved(remembered: Remembered, last_used: u64) -> Entry {
        Entry {
            remembered,
            last_used,
            saved: true,
            this_link: false,
        }
    }

    fn new(remembered: Remembered, last_used: u64) -> Entry {
        Entry {
            remembered,
            last_used,
            saved: false,
            this_link: true,
        }
    }

    /// Records a use now, when the last recorded one is older than [`USE_RESOLUTION_SECS`];
    /// whether it did (the entry must then be saved again).
    fn used(&mut self, now: u64) -> bool {
        self.this_link = true;
        let stale = self.last_used + USE_RESOLUTION_SECS <= now;
        if stale {
            self.last_used = now;
            self.saved = false;
        }
        stale
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Caps {
    files: usize,
    derived: usize,
}

impl Caps {
    /// A part's share of the fixed caps, or [`WORKING_SETS`] times what this link used of the
    /// part, whichever is more.
    fn for_link(entries: &HashMap<FileKey, Entry>, derived: &HashMap<String, Derived>) -> Caps {
        let used_files = entries.values().filter(|e| e.this_link).count();
        let used_derived = derived.values().filter(|d| d.entry.this_link).count();
        Caps {
            files: (MAX_ENTRIES / PARTS).max(WORKING_SETS * used_files),
            derived: (MAX_DERIVED / PARTS).max(WORKING_SETS * used_derived),
        }
    }
}

/// A file entry's checked line (none for a path that cannot be written: it holds a newline).
fn file_line((key, entry): (&FileKey, &Entry)) -> Option<Vec<u8>> {
    Some(checked(&key.to_line(entry)?))
}

/// A derived digest's checked line: `derived <slot> <key> <last-used> <hash> <size>`.
fn derived_line((slot, Derived { key, entry }): (&String, &Derived)) -> Vec<u8> {
    let Digest { hash, size_bytes } = &entry.remembered.digest;
    let last_used = entry.last_used;
    let line = format!("{DERIVED} {slot} {key} {last_used} {hash} {size_bytes}");
    checked(line.as_bytes())
}

/// Appends `lines` to `file` in one write, after a newline that ends a line a killed writer may
/// have left unfinished. The file must exist (else it is written whole, with its header).
fn append(file: &Path, lines: &[Vec<u8>]) -> std::io::Result<()> {
    if lines.is_empty() {
        return Ok(());
    }
    let mut block = vec![b'\n'];
    for line in lines {
        block.extend_from_slice(line);
    }
    let mut options = std::fs::OpenOptions::new();
    platform::open_no_follow(options.append(true), file)?.write_all(&block)
}

/// Writes the whole cache, merged with what is in `file` by now and trimmed to the most recently
/// used, to a temporary file renamed over `file`; the lines it wrote.
///
/// The lines on disk are checked and parsed one at a time and kept as they are (a range of the
/// file's bytes), not as entries: at 50,000 modules the file holds some 200,000 lines, and making an
/// entry of each (paths, digests, map slots) took the link's memory up by ~2 KB a line.
fn compact(
    file: &Path,
    entries: &HashMap<FileKey, Entry>,
    derived: &HashMap<String, Derived>,
    caps: Caps,
) -> std::io::Result<usize> {
    let on_disk = std::fs::read(file).unwrap_or_default();
    let mut candidates = lines_on_disk(&on_disk);
    // This process's entries come last, so that they supersede the lines of the same keys.
    for (key, entry) in entries {
        if let Some(line) = file_line((key, entry)) {
            candidates.push(Candidate::made(key.identity(), false, entry, line));
        }
    }
    for (slot, found) in derived {
        let line = derived_line((slot, found));
        candidates.push(Candidate::made(
            key_hash(slot.as_bytes()),
            true,
            &found.entry,
            line,
        ));
    }
    // One line per key: the most recently used, the later of equals; it was this link's if any of
    // the key's lines was (another process may have recorded a later use of the same entry).
    let mut newest: HashMap<(bool, u64), usize> = HashMap::with_capacity(candidates.len());
    for at in 0..candidates.len() {
        let key = (candidates[at].derived, candidates[at].identity);
        match newest.entry(key) {
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(at);
            }
            std::collections::hash_map::Entry::Occupied(mut slot) => {
                let kept = *slot.get();
                let this_link = candidates[kept].this_link || candidates[at].this_link;
                if candidates[kept].last_used <= candidates[at].last_used {
                    slot.insert(at);
                }
                candidates[*slot.get()].this_link = this_link;
            }
        }
    }
    let (derived_lines, file_lines): (Vec<usize>, Vec<usize>) =
        newest.into_values().partition(|&at| candidates[at].derived);
    let mut kept = most_recently_used(file_lines, &candidates, caps.files);
    kept.extend(most_recently_used(derived_lines, &candidates, caps.derived));
    // In the order they came: a later compaction prefers the later of a day's lines.
    kept.sort_unstable();
    let dir = file.parent().unwrap_or(Path::new("."));
    create_private_dir(dir)?;
    let mut out = std::io::BufWriter::new(tempfile::NamedTempFile::new_in(dir)?);
    writeln!(out, "{HEADER}")?;
    for &at in &kept {
        match &candidates[at].line {
            Line::OnDisk(range) => out.write_all(&on_disk[range.clone()])?,
            Line::Made(line) => out.write_all(line)?,
        }
    }
    let tmp = out.into_inner().map_err(|e| e.into_error())?;
    tmp.persist(file).map_err(|e| e.error)?;
    Ok(kept.len())
}

/// A line a compaction may write.
struct Candidate {
    /// A hash of the entry's key (a file's stamp and path, a derived digest's slot): the lines of
    /// one key hold versions of one entry, of which one is kept. Two keys of one hash would keep
    /// one entry of the two, which costs a hash later, never a wrong digest.
    identity: u64,
    derived: bool,
    last_used: u64,
    this_link: bool,
    line: Line,
}

enum Line {
    /// The line's bytes in the file read, its newline included.
    OnDisk(Range<usize>),
    /// A checked line made from this process's entry.
    Made(Vec<u8>),
}

impl Candidate {
    fn made(identity: u64, derived: bool, entry: &Entry, line: Vec<u8>) -> Candidate {
        Candidate {
            identity,
            derived,
            last_used: entry.last_used,
            this_link: entry.this_link,
            line: Line::Made(line),
        }
    }
}

/// The valid lines of a cache file's `bytes`, in order (none when it has no header of this
/// format).
fn lines_on_disk(bytes: &[u8]) -> Vec<Candidate> {
    let Some(body) = body_lines(bytes) else {
        return Vec::new();
    };
    body.filter_map(|range| {
        let line = verified(&bytes[range.clone()])?;
        let (identity, derived, last_used) = match line.strip_prefix(DERIVED.as_bytes()) {
            Some(rest) => {
                let (slot, found) = derived_from_line(rest)?;
                (key_hash(slot.as_bytes()), true, found.entry.last_used)
            }
            None => {
                let (key, entry) = FileKey::from_line(line)?;
                (key.identity(), false, entry.last_used)
            }
        };
        Some(Candidate {
            identity,
            derived,
            last_used,
            this_link: false,
            // With its newline.
            line: Line::OnDisk(range.start..range.end + 1),
        })
    })
    .collect()
}

/// Where each line of a cache file's `bytes` after the header is (newline excluded), or None when
/// it has no header of this format. A line without its newline (the last, cut short) is never
/// trusted.
fn body_lines(bytes: &[u8]) -> Option<impl Iterator<Item = Range<usize>> + '_> {
    let body = bytes.strip_prefix(HEADER.as_bytes())?.strip_prefix(b"\n")?;
    let mut start = bytes.len() - body.len();
    let offset = start;
    Some(memchr::memchr_iter(b'\n', body).map(move |at| {
        let line = start..offset + at;
        start = offset + at + 1;
        line
    }))
}

/// The lines of a cache file, indexed by a hash of their keys and parsed only when looked up.
#[derive(Debug, Default)]
struct Unparsed {
    bytes: Vec<u8>,
    /// File lines by [`FileKey::hash`].
    files: LineIndex,
    /// Derived lines by the hash of their slot.
    derived: LineIndex,
}

impl Unparsed {
    /// Indexes a cache file's bytes; with the lines after its header, None when it has no header
    /// of this format. Checksums are checked when a line is looked up, not here.
    fn index(bytes: Vec<u8>) -> (Unparsed, Option<usize>) {
        let mut unparsed = Unparsed::default();
        let Some(body) = body_lines(&bytes) else {
            return (unparsed, None);
        };
        let mut lines = 0;
        for line in body {
            lines += 1;
            if let Some((is_file, hash)) = key_of(&bytes[line.clone()]) {
                let index = if is_file {
                    &mut unparsed.files
                } else {
                    &mut unparsed.derived
                };
                index.lines.push((hash, line));
            }
        }
        unparsed.files.seal();
        unparsed.derived.seal();
        unparsed.bytes = bytes;
        (unparsed, Some(lines))
    }

    /// Parses the lines that may hold `key` into `entries` (every line of the same hash, once).
    fn parse_file(&mut self, key: &FileKey, entries: &mut HashMap<FileKey, Entry>) {
        for line in self.files.take(key.hash()) {
            if let Some((key, entry)) = verified(&self.bytes[line]).and_then(FileKey::from_line) {
                merge_one(entries, key, entry);
            }
        }
    }

    /// Parses the lines that may hold `slot` into `derived` (in file order: the last one wins).
    fn parse_derived(&mut self, slot: &str, derived: &mut HashMap<String, Derived>) {
        for line in self.derived.take(key_hash(slot.as_bytes())) {
            let parsed = verified(&self.bytes[line])
                .and_then(|line| line.strip_prefix(DERIVED.as_bytes()))
                .and_then(derived_from_line);
            if let Some((parsed_slot, found)) = parsed
                && parsed_slot == slot
            {
                derived.insert(parsed_slot, found);
            }
        }
    }
}

/// Lines of a cache file by the hash of their keys: one vector, sorted once, searched by halving;
/// each hash's lines are handed out once. (A map of hashes to lists of lines cost an allocation and
/// two hashings per line, most of opening a cache of thousands of lines.)
#[derive(Debug, Default)]
struct LineIndex {
    /// Each line's hash and where it is in the file's bytes, sorted once all are in; a line
    /// handed out is left as an empty range.
    lines: Vec<(u64, Range<usize>)>,
    /// How many hashes still have lines to hand out.
    remaining: usize,
}

impl LineIndex {
    /// Sorts the lines pushed so far (by hash, then by place in the file), ready for [`Self::take`].
    fn seal(&mut self) {
        self.lines
            .sort_unstable_by_key(|(hash, line)| (*hash, line.start));
        self.remaining = self.lines.chunk_by(|a, b| a.0 == b.0).count();
    }

    /// The lines of `hash`, in file order, once: a later call for it finds none.
    fn take(&mut self, hash: u64) -> impl Iterator<Item = Range<usize>> + '_ {
        let first = self.lines.partition_point(|(h, _)| *h < hash);
        let count = self.lines[first..].partition_point(|(h, _)| *h == hash);
        let lines = &mut self.lines[first..first + count];
        if lines.first().is_some_and(|(_, line)| !line.is_empty()) {
            self.remaining -= 1;
        }
        lines.iter_mut().map(|(_, line)| std::mem::take(line))
    }

    /// How many hashes still have lines to hand out.
    fn len(&self) -> usize {
        self.remaining
    }
}

/// Whether `line` (of a cache file) is a file's (else a derived digest's), and the hash of its key;
/// None for a line of neither form.
fn key_of(line: &[u8]) -> Option<(bool, u64)> {
    let rest = line.get(CHECKSUM_DIGITS..)?.strip_prefix(b" ")?;
    if let Some(rest) = rest.strip_prefix(DERIVED.as_bytes()) {
        // `<slot> <key> <last-used> <hash> <size>`: a line of the slotless format (one field
        // fewer) is not indexed, so it counts as dead, and the next compaction drops it.
        let rest = rest.strip_prefix(b" ")?;
        if memchr::memchr_iter(b' ', rest).count() != 4 {
            return None;
        }
        let slot = &rest[..memchr::memchr(b' ', rest)?];
        return Some((false, key_hash(slot)));
    }
    // `device inode size mtime ctime` (the stamp), 4 fields, the path.
    let stamp_end = memchr::memchr_iter(b' ', rest).nth(4)?;
    Some((true, key_hash(&rest[..stamp_end])))
}

/// The hash a key's lines are indexed by.
fn key_hash(key: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::hash::DefaultHasher::new();
    key.hash(&mut hasher);
    hasher.finish()
}

/// ` <slot> <key> <last-used> <hash> <size>` (after the `derived` word).
fn derived_from_line(rest: &[u8]) -> Option<(String, Derived)> {
    let text = std::str::from_utf8(rest).ok()?;
    let mut fields = text.strip_prefix(' ')?.split(' ');
    let slot = fields.next()?;
    let key = fields.next()?;
    let last_used = fields.next()?.parse().ok()?;
    let hash = fields.next()?.to_owned();
    let size_bytes = fields.next()?.parse().ok()?;
    let digest = Digest { hash, size_bytes };
    let hex64 = |field: &str| field.len() == 64 && field.bytes().all(|b| b.is_ascii_hexdigit());
    let valid = fields.next().is_none() && hex64(slot) && hex64(key) && digest::is_valid(&digest);
    let remembered = Remembered {
        digest,
        module_hash: None,
    };
    let entry = Entry::saved(remembered, last_used);
    valid.then(|| {
        (
            slot.to_owned(),
            Derived {
                key: key.to_owned(),
                entry,
            },
        )
    })
}

/// Adds an entry read from the file to `entries`: one already there stays, with the later use of the two.
fn merge_one<K: std::hash::Hash + Eq>(entries: &mut HashMap<K, Entry>, key: K, saved: Entry) {
    let last_used = saved.last_used;
    let entry = entries.entry(key).or_insert(saved);
    entry.last_used = entry.last_used.max(last_used);
}

/// All of `kept` (indices into `candidates`) if they are at most `max`; else the most recently
/// used, this link's first, down to [`TRIMMED_SHARE`] of `max` (or as many as this link used, if
/// more, up to `max`).
///
/// Trimming below the cap lets the links after it append again: trimmed to the cap exactly, the
/// cache compacted on every link that added anything, and with `last_used` equal for a day's
/// entries, each compaction dropped an arbitrary part of what the next link would look up (at
/// 50,000 modules, a relink's rewritten shards: made again, and the cache compacted again).
fn most_recently_used(mut kept: Vec<usize>, candidates: &[Candidate], max: usize) -> Vec<usize> {
    if kept.len() > max {
        let this_link = kept.iter().filter(|&&at| candidates[at].this_link).count();
        let keep = (max / TRIMMED_SHARE.1 * TRIMMED_SHARE.0)
            .max(this_link)
            .min(max);
        kept.sort_unstable_by_key(|&at| {
            let Candidate {
                this_link,
                last_used,
                ..
            } = candidates[at];
            std::cmp::Reverse((this_link, last_used, at))
        });
        kept.truncate(keep);
    }
    kept
}

#[cfg(all(test, unix))]
mod tests {
    use std::sync::OnceLock;
    use std::time::SystemTime;

    use super::super::{DigestCache, part_name, part_of, scratch};
    use super::*;

    impl DigestCache {
        /// Every file entry of every part, the lines all parsed.
        fn into_entries(self) -> HashMap<FileKey, Entry> {
            let mut entries = HashMap::new();
            for index in 0..PARTS {
                drop(self.part(index));
            }
            for part in self.parts {
                let part = part.into_inner().unwrap();
                for (key, entry) in part.entries {
                    merge_one(&mut entries, key, entry);
                }
                for (_, line) in &part.unparsed.files.lines {
                    let line = &part.unparsed.bytes[line.clone()];
                    if let Some((key, entry)) = verified(line).and_then(FileKey::from_line) {
                        merge_one(&mut entries, key, entry);
                    }
                }
            }
            entries
        }

        /// Whether the part of `key` has anything to save.
        fn changed(&self, key: &FileKey) -> bool {
            self.parts[key.part()].lock().unwrap().changed
        }
    }

    /// The file of the part that holds `key` in the cache directory `store`.
    fn part_file(store: &Path, key: &[u8]) -> PathBuf {
        store.join(part_name(part_of(key)))
    }

    fn remembered(bytes: &[u8], module_hash: Option<[u32; 5]>) -> Remembered {
        Remembered {
            digest: digest::of_bytes(bytes),
            module_hash,
        }
    }

    /// Derived digest `i`'s slot: all of them in one part (the part of slot 0), so that a test can
    /// fill a part to its cap.
    fn slot(i: usize) -> String {
        static SLOTS: OnceLock<Vec<String>> = OnceLock::new();
        let slots = SLOTS.get_or_init(|| {
            let hex = |n: usize| format!("{n:064x}");
            let part = part_of(hex(0).as_bytes());
            (0..)
                .map(hex)
                .filter(|slot| part_of(slot.as_bytes()) == part)
                .take(MAX_DERIVED / PARTS + 2)
                .collect()
        });
        slots[i].clone()
    }

    fn key(i: usize) -> String {
        format!("{:064x}", i + 1)
    }

    /// The file of the part that holds the slots of [`slot`].
    fn slots_file(store: &Path) -> PathBuf {
        part_file(store, slot(0).as_bytes())
    }

    /// Paths in `dir` whose entries are all in one part.
    fn files_of_one_part(dir: &Path, count: usize) -> Vec<PathBuf> {
        let path = |i: usize| dir.join(format!("{i}.o"));
        let part = path(0).as_os_str().as_encoded_bytes().to_vec();
        let part = part_of(&part);
        (0..)
            .map(path)
            .filter(|p| part_of(p.as_os_str().as_encoded_bytes()) == part)
            .take(count)
            .collect()
    }

    fn seconds_now() -> u64 {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    }

    /// The checked line of derived digest `i`, last used at `last_used`.
    fn derived_line_of(i: usize, last_used: u64) -> Vec<u8> {
        let hash = "a".repeat(64);
        let line = format!("{DERIVED} {} {} {last_used} {hash} 3", slot(i), key(i));
        checked(line.as_bytes())
    }

    /// A part file of derived digests `indices`, each last used at `last_used`.
    fn write_derived(part: &Path, indices: Range<usize>, last_used: u64) {
        let mut text = format!("{HEADER}\n").into_bytes();
        for i in indices {
            text.extend(derived_line_of(i, last_used));
        }
        std::fs::create_dir_all(part.parent().unwrap()).unwrap();
        std::fs::write(part, &text).unwrap();
    }

    /// The most derived digests a part keeps.
    const PART_CAP: usize = MAX_DERIVED / PARTS;

    #[test]
    fn derived_digests_survive_a_round_trip_and_older_readers_skip_them() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("digests");
        let (slot, key) = ("cd".repeat(32), "ab".repeat(32));
        let file = part_file(&store, slot.as_bytes());
        let cache = DigestCache::open(Some(store.clone()));
        assert_eq!(cache.derived(&slot, &key), None);
        cache.remember_derived(slot.clone(), key.clone(), digest::of_bytes(b"rewritten"));
        cache.save().unwrap();
        let again = DigestCache::open(Some(store.clone()));
        assert_eq!(
            again.derived(&slot, &key),
            Some(digest::of_bytes(b"rewritten"))
        );
        // Another key in the slot is not what it holds.
        assert_eq!(again.derived(&slot, &"ef".repeat(32)), None);
        // A derived line is no file entry; a malformed one is skipped.
        let text = std::fs::read_to_string(&file).unwrap();
        let line = verified(text.lines().nth(1).unwrap().as_bytes()).unwrap();
        assert!(FileKey::from_line(line).is_none());
        let bad = checked(format!("derived {slot} {key} 1 not-a-hash 9").as_bytes());
        std::fs::write(&file, [text.as_bytes(), &bad].concat()).unwrap();
        assert_eq!(
            DigestCache::open(Some(store)).derived(&slot, &key),
            Some(digest::of_bytes(b"rewritten"))
        );
    }

    #[test]
    fn a_slot_holds_the_latest_version_and_the_dead_lines_are_compacted_away() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("file-digests");
        let slot = "cd".repeat(32);
        let file = part_file(&store, slot.as_bytes());
        let version = |i: usize| {
            (
                format!("{i:064x}"),
                digest::of_bytes(i.to_string().as_bytes()),
            )
        };
        // Relinks that each change what the slot's content derives from, as edits do: each
        // appends one line, which replaces the one before.
        for i in 0..3 {
            let cache = DigestCache::open(Some(store.clone()));
            let (key, digest) = version(i);
            if i > 0 {
                assert_eq!(
                    cache.derived(&slot, &version(i - 1).0),
                    Some(version(i - 1).1)
                );
            }
            assert_eq!(cache.derived(&slot, &key), None);
            cache.remember_derived(slot.clone(), key, digest);
            cache.save().unwrap();
        }
        let cache = DigestCache::open(Some(store.clone()));
        assert_eq!(cache.derived(&slot, &version(2).0), Some(version(2).1));
        assert_eq!(cache.derived(&slot, &version(1).0), None);
        // One live entry: lines beyond twice that and the slack make the next save compact,
        // with the slotless lines of the format before, which are not read.
        let mut text = std::fs::read(&file).unwrap();
        let legacy =
            checked(format!("derived {} 1 {} 1", "ab".repeat(32), "ef".repeat(32)).as_bytes());
        for _ in 0..COMPACT_SLACK {
            text.extend_from_slice(&legacy);
        }
        std::fs::write(&file, &text).unwrap();
        let cache = DigestCache::open(Some(store.clone()));
        assert_eq!(cache.derived(&slot, &version(2).0), Some(version(2).1));
        let (key, digest) = version(3);
        cache.remember_derived(slot.clone(), key.clone(), digest.clone());
        cache.save().unwrap();
        let compacted = std::fs::read_to_string(&file).unwrap();
        assert_eq!(compacted.lines().count(), 2, "{compacted}");
        assert_eq!(
            DigestCache::open(Some(store)).derived(&slot, &key),
            Some(digest)
        );
    }

    #[test]
    fn foreign_old_or_damaged_files_are_empty_parts() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("file-digests");
        let part = store.join(part_name(0));
        std::fs::create_dir(&store).unwrap();
        let entries = |cache: DigestCache| cache.into_entries().len();
        std::fs::write(&part, b"something else\n1 2 3\n").unwrap();
        assert_eq!(entries(DigestCache::open(Some(store.clone()))), 0);
        std::fs::write(&part, [0xff, 0, 0x80, b'\n', 7]).unwrap();
        assert_eq!(entries(DigestCache::open(Some(store.clone()))), 0);

        // A version-1 file, whose lines lack the module hash and last use, a version-2 file,
        // whose lines lack checksums, and a version-3 file (the whole cache in one) are empty.
        let hash = "a".repeat(64);
        let v1 = format!("dtlto-reapi digest cache v1\n1 2 3 4 5 {hash} 3 /p\n");
        std::fs::write(&part, v1).unwrap();
        assert_eq!(entries(DigestCache::open(Some(store.clone()))), 0);
        let v2 = format!("dtlto-reapi digest cache v2\n1 2 3 4 5 6 {hash} 3 - /p\n");
        std::fs::write(&part, v2).unwrap();
        assert_eq!(entries(DigestCache::open(Some(store.clone()))), 0);
        let v3 = [
            b"dtlto-reapi digest cache v3\n".to_vec(),
            checked(format!("1 2 3 4 5 6 {hash} 3 - /p").as_bytes()),
        ];
        std::fs::write(&part, v3.concat()).unwrap();
        assert_eq!(entries(DigestCache::open(Some(store.clone()))), 0);

        // Only the well-formed line whose digest size matches the file size survives: not one
        // with another size, a short or non-hex module hash, missing fields, a wrong checksum or
        // none, or one cut short.
        let module = "0123456789abcdef0123456789abcdef01234567";
        let good = checked(format!("1 2 3 4 5 6 {hash} 3 - /u").as_bytes());
        let mut wrong_sum = good.clone();
        wrong_sum[0] = if wrong_sum[0] == b'0' { b'1' } else { b'0' };
        let lines = [
            format!("{HEADER}\n").into_bytes(),
            checked(format!("1 2 3 4 5 6 {hash} 3 {module} /p q").as_bytes()),
            checked(format!("1 2 4 4 5 6 {hash} 3 - /r").as_bytes()),
            checked(format!("1 2 3 4 5 6 {hash} 3 0123 /s").as_bytes()),
            checked(format!("1 2 3 4 5 6 {hash} 3 {} /t", "g".repeat(40)).as_bytes()),
            checked(b"1 2 x"),
            format!("1 2 3 4 5 6 {hash} 3 - /no-checksum\n").into_bytes(),
            wrong_sum
                .iter()
                .map(|&b| if b == b'u' { b'v' } else { b })
                .collect(),
            good,
            checked(format!("1 2 3 4 5 6 {hash} 3 - /truncated").as_bytes()),
        ]
        .concat();
        std::fs::write(&part, &lines[..lines.len() - 1]).unwrap();
        let entries = DigestCache::open(Some(store)).into_entries();
        let mut paths: Vec<&Path> = entries.keys().map(|k| k.path.as_path()).collect();
        paths.sort();
        assert_eq!(paths, [Path::new("/p q"), Path::new("/u")]);
    }

    #[test]
    fn trimming_keeps_this_links_entries_then_the_most_recently_used_below_the_cap() {
        // Days 0 to 9 as read from the file, then two entries of day 0 that this link looked up.
        let candidate = |day: u64, this_link| Candidate {
            identity: 0,
            derived: false,
            last_used: day * USE_RESOLUTION_SECS,
            this_link,
            line: Line::Made(Vec::new()),
        };
        let mut candidates: Vec<Candidate> = (0..10).map(|day| candidate(day, false)).collect();
        candidates.extend([candidate(0, true), candidate(0, true)]);
        let kept = |candidates: &[Candidate], max| {
            let mut kept = most_recently_used((0..12).collect(), candidates, max);
            kept.sort_unstable();
            kept
        };
        assert_eq!(
            kept(&candidates, 20).len(),
            12,
            "under the cap, nothing goes"
        );
        // Over the cap of 8: three quarters of it, this link's first.
        assert_eq!(kept(&candidates, 8), [6, 7, 8, 9, 10, 11]);
        // This link's entries stay even beyond three quarters, up to the cap.
        assert_eq!(kept(&candidates, 2), [10, 11]);
        // Among a day's entries, the later lines.
        candidates.iter_mut().for_each(|c| c.last_used = 0);
        assert_eq!(kept(&candidates, 8), [6, 7, 8, 9, 10, 11]);
    }

    #[test]
    fn a_lookup_records_the_use_at_most_once_a_day() {
        let (_dir, store, file, meta) = scratch("file-digests", "f");
        let key = FileKey::new(&file, &meta);
        let cache = DigestCache::open(Some(store.clone()));
        cache.insert(key.clone(), remembered(b"abc", None));
        cache.save().unwrap();
        // Used today: looking it up again writes nothing.
        let again = DigestCache::open(Some(store.clone()));
        assert!(again.lookup(&file, &meta).is_some());
        assert!(!again.changed(&key));
        // Last used long ago: the use is recorded, in a line appended.
        let old = Entry::saved(remembered(b"abc", None), 1000);
        let text = [
            format!("{HEADER}\n").into_bytes(),
            checked(&key.to_line(&old).unwrap()),
        ];
        let part = part_file(&store, file.as_os_str().as_encoded_bytes());
        std::fs::write(&part, text.concat()).unwrap();
        let later = DigestCache::open(Some(store.clone()));
        assert!(later.lookup(&file, &meta).is_some());
        assert!(later.changed(&key));
        later.save().unwrap();
        let entry = Entry::saved(remembered(b"abc", None), later.now);
        let used = [
            text.concat(),
            b"\n".to_vec(),
            checked(&key.to_line(&entry).unwrap()),
        ];
        assert_eq!(std::fs::read(&part).unwrap(), used.concat());
        let reread = DigestCache::open(Some(store)).into_entries();
        assert_eq!(reread[&key].last_used, later.now);
    }

    #[test]
    fn a_save_appends_what_is_new_and_survives_torn_lines() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("file-digests");
        let files = files_of_one_part(dir.path(), 3);
        let part = part_file(&store, files[0].as_os_str().as_encoded_bytes());
        let stamped = |path: &Path| {
            let bytes = path.as_os_str().as_encoded_bytes();
            std::fs::write(path, bytes).unwrap();
            let stamp = platform::stamp_path(path).unwrap();
            (FileKey::new(path, &stamp), remembered(bytes, None))
        };
        let first = DigestCache::open(Some(store.clone()));
        let (key, value) = stamped(&files[0]);
        first.insert(key, value);
        first.save().unwrap();
        let saved = std::fs::read(&part).unwrap();

        // Another link adds one file: the part grows by that line only.
        let second = DigestCache::open(Some(store.clone()));
        let (key, value) = stamped(&files[1]);
        second.insert(key.clone(), value.clone());
        second.save().unwrap();
        let grown = std::fs::read(&part).unwrap();
        assert_eq!(&grown[..saved.len()], saved.as_slice());
        let line = checked(&key.to_line(&Entry::saved(value, second.now)).unwrap());
        assert_eq!(&grown[saved.len()..], [b"\n".as_slice(), &line].concat());
        // Saving again with nothing new writes nothing.
        second.save().unwrap();
        assert_eq!(std::fs::read(&part).unwrap(), grown);

        // A link killed while appending left half a line: the next one's lines are intact, and
        // the torn line, though its start looks like an entry, is not trusted.
        let torn = &line[..line.len() - 10];
        std::fs::write(&part, [grown.as_slice(), b"\n", torn].concat()).unwrap();
        let third = DigestCache::open(Some(store.clone()));
        let (key, value) = stamped(&files[2]);
        third.insert(key, value);
        third.save().unwrap();
        let entries = DigestCache::open(Some(store)).into_entries();
        let mut paths: Vec<&Path> = entries.keys().map(|k| k.path.as_path()).collect();
        paths.sort();
        let mut expected: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
        expected.sort();
        assert_eq!(paths, expected);
    }

    #[test]
    fn lines_are_parsed_when_looked_up_and_count_as_live_before() {
        let (_dir, store, file, meta) = scratch("file-digests", "f");
        let hash = "a".repeat(64);
        // More lines than the slack a save allows before it compacts, none yet looked up.
        let others = (0..2 * COMPACT_SLACK)
            .map(|i| checked(format!("1 {i} 3 4 5 6 {hash} 3 - /elsewhere/{i}").as_bytes()));
        let mut text = format!("{HEADER}\n").into_bytes();
        text.extend(others.flatten());
        let (key, entry) = (
            FileKey::new(&file, &meta),
            Entry::saved(remembered(b"abc", None), 6),
        );
        text.extend(checked(&key.to_line(&entry).unwrap()));
        let part = part_file(&store, file.as_os_str().as_encoded_bytes());
        std::fs::create_dir(&store).unwrap();
        std::fs::write(&part, &text).unwrap();

        let cache = DigestCache::open(Some(store.clone()));
        assert_eq!(cache.lookup(&file, &meta), Some(remembered(b"abc", None)));
        {
            let part = cache.parts[key.part()].lock().unwrap();
            assert_eq!(part.entries.len(), 1);
            assert_eq!(part.unparsed.files.len(), 2 * COMPACT_SLACK);
        }
        // The lookup recorded a use: a save appends it, since the lines not looked up are live.
        cache.save().unwrap();
        let saved = std::fs::read(&part).unwrap();
        assert_eq!(&saved[..text.len()], text.as_slice());
        assert_eq!(
            DigestCache::open(Some(store)).into_entries().len(),
            2 * COMPACT_SLACK + 1
        );
    }

    #[test]
    fn a_save_compacts_a_file_that_holds_twice_the_lines_it_needs() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("file-digests");
        let part = slots_file(&store);
        let cache = DigestCache::open(Some(store.clone()));
        cache.remember_derived(slot(0), key(0), digest::of_bytes(b"0"));
        cache.save().unwrap();
        // The same entry appended again and again (as links do that record a use), and torn
        // lines: more than twice the lines the one entry needs, and the slack.
        let mut text = std::fs::read(&part).unwrap();
        let line = text[HEADER.len() + 1..].to_vec();
        for _ in 0..COMPACT_SLACK + 2 {
            text.extend_from_slice(&line);
            text.extend_from_slice(b"torn\n");
        }
        std::fs::write(&part, &text).unwrap();
        let grown = DigestCache::open(Some(store.clone()));
        grown.remember_derived(slot(1), key(1), digest::of_bytes(b"1"));
        let lines = grown.parts[part_of(slot(0).as_bytes())]
            .lock()
            .unwrap()
            .lines;
        assert_eq!(lines, Some(2 * COMPACT_SLACK + 5));
        grown.save().unwrap();
        // Written whole: the header and the two entries' lines.
        let compacted = std::fs::read_to_string(&part).unwrap();
        assert_eq!(compacted.lines().count(), 3, "{compacted}");
        assert!(compacted.starts_with(HEADER));
        let again = DigestCache::open(Some(store));
        assert_eq!(
            again.derived(&slot(0), &key(0)),
            Some(digest::of_bytes(b"0"))
        );
        assert_eq!(
            again.derived(&slot(1), &key(1)),
            Some(digest::of_bytes(b"1"))
        );
    }

    #[test]
    fn a_compaction_over_the_cap_keeps_what_this_link_used_and_leaves_room() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("file-digests");
        let part = slots_file(&store);
        // A full part of derived digests, all used today: `last_used` cannot tell them apart.
        write_derived(&part, 0..PART_CAP, seconds_now());
        // This link uses the first lines (the ones an arbitrary trim among equals drops first)
        // and adds one: over the cap, so the save compacts.
        let cache = DigestCache::open(Some(store.clone()));
        let used = 0..10;
        for i in used.clone() {
            assert!(cache.derived(&slot(i), &key(i)).is_some());
        }
        let new = digest::of_bytes(b"new");
        cache.remember_derived(slot(PART_CAP), key(PART_CAP), new.clone());
        cache.save().unwrap();

        let compacted = std::fs::read_to_string(&part).unwrap();
        let kept = PART_CAP / TRIMMED_SHARE.1 * TRIMMED_SHARE.0;
        assert_eq!(compacted.lines().count(), 1 + kept);
        let again = DigestCache::open(Some(store));
        for i in used {
            assert!(
                again.derived(&slot(i), &key(i)).is_some(),
                "line {i} dropped"
            );
        }
        assert_eq!(again.derived(&slot(PART_CAP), &key(PART_CAP)), Some(new));
        // The rest are the latest lines of the file.
        assert!(
            again
                .derived(&slot(PART_CAP - 1), &key(PART_CAP - 1))
                .is_some()
        );
        assert!(again.derived(&slot(10), &key(10)).is_none());
    }

    #[test]
    fn a_link_larger_than_a_third_of_the_cap_keeps_room_for_three_like_it() {
        // Two build directories of a large project (a full part), and a relink in the first that
        // adds one digest: the cap makes room for three such links, so nothing goes.
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("file-digests");
        let part = slots_file(&store);
        let half = PART_CAP / 2;
        write_derived(&part, 0..PART_CAP, seconds_now());
        let cache = DigestCache::open(Some(store.clone()));
        for i in 0..half {
            assert!(cache.derived(&slot(i), &key(i)).is_some());
        }
        cache.remember_derived(slot(PART_CAP), key(PART_CAP), digest::of_bytes(b"new"));
        cache.save().unwrap();

        let again = DigestCache::open(Some(store.clone()));
        for i in 0..=PART_CAP {
            assert!(again.derived(&slot(i), &key(i)).is_some(), "{i} dropped");
        }
        // Appended, not compacted.
        let text = std::fs::read_to_string(&part).unwrap();
        assert_eq!(
            text.lines().count(),
            1 + PART_CAP + 2,
            "a blank line, then the new one"
        );
    }

    #[test]
    fn a_key_this_link_used_keeps_its_priority_when_another_process_saved_it_later() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("file-digests");
        let part = slots_file(&store);
        let day = USE_RESOLUTION_SECS;
        let now = seconds_now();
        // Entry 0 was last used days ago, the others are used "in two days" (a clock ahead).
        write_derived(&part, 0..1, now - 3 * day);
        let mut text = std::fs::read(&part).unwrap();
        for i in 1..PART_CAP {
            text.extend(derived_line_of(i, now + 2 * day));
        }
        std::fs::write(&part, &text).unwrap();
        let cache = DigestCache::open(Some(store.clone()));
        assert!(cache.derived(&slot(0), &key(0)).is_some());
        // Meanwhile another process records a use of entry 0 a day ahead: later than this link's,
        // earlier than the others'.
        append(&part, &[derived_line_of(0, now + day)]).unwrap();
        cache.remember_derived(slot(PART_CAP), key(PART_CAP), digest::of_bytes(b"new"));
        cache.save().unwrap();

        let again = DigestCache::open(Some(store));
        assert!(
            again.derived(&slot(0), &key(0)).is_some(),
            "the entry this link used was trimmed"
        );
    }
}
