//! Where blobs and action results live: in memory by default, or under `--cas-dir` so that they
//! survive a restart. Both stores are maps from a digest to bytes; the CAS verifies every blob
//! against its digest before storing it, and every blob it reads from disk again (a file under
//! `--cas-dir` may have been changed behind its back), so nothing unverified is ever served: a
//! file that no longer matches is removed and the blob reported missing, for clients to upload
//! again.
//!
//! Access is synchronous (disk reads, writes and hashing): the services call the storage from
//! blocking threads ([`super::context::blocking`]), never from the async ones, except for the
//! existence checks (a `stat`) of ByteStream writes.

use super::digest::BlobDigest;
use bazel_remote_apis::build::bazel::remote::execution::v2::ActionResult;
use bytes::Bytes;
use prost::Message;
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::RwLock;
use tonic::Status;

/// One namespace of digest-keyed values.
enum Store {
    Memory(RwLock<HashMap<BlobDigest, Bytes>>),
    Disk(PathBuf),
}

impl Store {
    fn open(dir: Option<&Path>, name: &str) -> anyhow::Result<Self> {
        Ok(match dir {
            None => Store::Memory(RwLock::default()),
            Some(dir) => {
                let dir = dir.join(name);
                std::fs::create_dir_all(&dir).map_err(|e| {
                    anyhow::anyhow!("cannot create the store directory {}: {e}", dir.display())
                })?;
                Store::Disk(dir)
            }
        })
    }

    fn file(dir: &Path, key: &BlobDigest) -> PathBuf {
        dir.join(format!("{}-{}", key.hash, key.size))
    }

    fn get(&self, key: &BlobDigest) -> Result<Option<Bytes>, Status> {
        match self {
            Store::Memory(map) => Ok(map.read().map_err(poisoned)?.get(key).cloned()),
            Store::Disk(dir) => match std::fs::read(Self::file(dir, key)) {
                Ok(data) => Ok(Some(data.into())),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(Status::internal(format!("cannot read {key}: {e}"))),
            },
        }
    }

    /// Forgets `key` (best effort).
    fn remove(&self, key: &BlobDigest) {
        match self {
            Store::Memory(map) => {
                if let Ok(mut map) = map.write() {
                    map.remove(key);
                }
            }
            Store::Disk(dir) => {
                let _ = std::fs::remove_file(Self::file(dir, key));
            }
        }
    }

    fn contains(&self, key: &BlobDigest) -> Result<bool, Status> {
        match self {
            Store::Memory(map) => Ok(map.read().map_err(poisoned)?.contains_key(key)),
            Store::Disk(dir) => Ok(Self::file(dir, key).is_file()),
        }
    }

    fn put(&self, key: &BlobDigest, data: &[u8]) -> Result<(), Status> {
        match self {
            Store::Memory(map) => {
                let kept = kept_in_memory(data);
                map.write().map_err(poisoned)?.insert(key.clone(), kept);
                Ok(())
            }
            Store::Disk(dir) => {
                // Write beside the final name and rename, so a crash never leaves a torn value.
                let io = |e: std::io::Error| Status::internal(format!("cannot store {key}: {e}"));
                let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(io)?;
                tmp.write_all(data).map_err(io)?;
                tmp.persist(Self::file(dir, key)).map_err(|e| io(e.error))?;
                Ok(())
            }
        }
    }
}

/// Blobs at least this big are kept in memory of their own, which forks do not copy.
#[cfg(target_os = "linux")]
const FORK_EXCLUDED_SIZE: usize = 1 << 20;

/// `data` as the memory store keeps it. A big blob (the compiler, 185 MB for zig) gets a mapping
/// of its own that forked children do not inherit (`MADV_DONTFORK`): every action's worker forks
/// this process, and copying the page tables of such a blob (and unmapping them again) cost each
/// action about 15 ms of CPU, and its memory traffic slowed whatever else ran on the machine.
/// The children only exec the action (see `isolation`), so they never miss those pages.
fn kept_in_memory(data: &[u8]) -> Bytes {
    #[cfg(target_os = "linux")]
    if data.len() >= FORK_EXCLUDED_SIZE
        && let Ok(mut mapping) = memmap2::MmapMut::map_anon(data.len())
    {
        mapping.copy_from_slice(data);
        // Best effort: without the advice, forks only cost more.
        let _ = mapping.advise(memmap2::Advice::DontFork);
        if let Ok(mapping) = mapping.make_read_only() {
            return Bytes::from_owner(mapping);
        }
    }
    Bytes::copy_from_slice(data)
}

fn poisoned<T>(_: T) -> Status {
    Status::internal("storage lock poisoned by an earlier failure")
}

/// The content-addressable storage and the action cache.
pub struct Storage {
    cas: Store,
    action_cache: Store,
}

impl Storage {
    /// In memory when `dir` is None, else under `dir/cas` and `dir/ac`.
    pub fn open(dir: Option<&Path>) -> anyhow::Result<Self> {
        Ok(Self {
            cas: Store::open(dir, "cas")?,
            action_cache: Store::open(dir, "ac")?,
        })
    }

    /// Whether the blob is present. The empty blob always is.
    pub fn has_blob(&self, digest: &BlobDigest) -> Result<bool, Status> {
        if digest.size == 0 {
            return Ok(*digest == BlobDigest::of(&[]));
        }
        self.cas.contains(digest)
    }

    /// The blob's bytes, if present (and, on disk, still matching its digest).
    pub fn blob(&self, digest: &BlobDigest) -> Result<Option<Bytes>, Status> {
        if digest.size == 0 {
            // Every empty blob reads as empty, but only the digest of no bytes is valid.
            return Ok((*digest == BlobDigest::of(&[])).then(Bytes::new));
        }
        let data = self.cas.get(digest)?;
        if let Store::Disk(dir) = &self.cas
            && let Some(found) = &data
            && BlobDigest::of(found) != *digest
        {
            eprintln!(
                "dtlto-reapi serve: {} no longer holds blob {digest}: removed it",
                dir.display()
            );
            self.cas.remove(digest);
            return Ok(None);
        }
        Ok(data)
    }

    /// Forgets a blob, as an eviction would (`--fault-lose-inputs`).
    pub fn forget_blob(&self, digest: &BlobDigest) {
        self.cas.remove(digest);
    }

    /// Stores `data` under `digest` after checking that it matches (INVALID_ARGUMENT if not).
    pub fn put_blob(&self, digest: &BlobDigest, data: &[u8]) -> Result<(), Status> {
        digest.verify(data)?;
        if digest.size == 0 || self.cas.contains(digest)? {
            return Ok(());
        }
        self.cas.put(digest, data)
    }

    /// Stores `data` under its own digest and returns that digest.
    pub fn add_blob(&self, data: &[u8]) -> Result<BlobDigest, Status> {
        let digest = BlobDigest::of(data);
        self.put_blob(&digest, data)?;
        Ok(digest)
    }

    /// Reads and decodes a proto message stored in the CAS; None when absent.
    pub fn message<M: Message + Default>(&self, digest: &BlobDigest) -> Result<Option<M>, Status> {
        self.blob(digest)?
            .map(|data| {
                M::decode(&*data).map_err(|e| {
                    Status::invalid_argument(format!("blob {digest} is not a valid message: {e}"))
                })
            })
            .transpose()
    }

    pub fn action_result(&self, action: &BlobDigest) -> Result<Option<ActionResult>, Status> {
        self.action_cache
            .get(action)?
            .map(|data| {
                ActionResult::decode(&*data).map_err(|e| {
                    Status::internal(format!("corrupt action cache entry {action}: {e}"))
                })
            })
            .transpose()
    }

    pub fn put_action_result(
        &self,
        action: &BlobDigest,
        result: &ActionResult,
    ) -> Result<(), Status> {
        self.action_cache.put(action, &result.encode_to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The flags (`VmFlags` of /proc/self/smaps) of the mapping that holds `address`.
    #[cfg(target_os = "linux")]
    fn mapping_flags(address: usize) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("smaps");
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ')
                && let Some((start, end)) = range.split_once('-')
                && let (Ok(start), Ok(end)) = (
                    usize::from_str_radix(start, 16),
                    usize::from_str_radix(end, 16),
                )
            {
                inside = (start..end).contains(&address);
            } else if inside && let Some(flags) = line.strip_prefix("VmFlags:") {
                return flags.trim().to_owned();
            }
        }
        panic!("no mapping holds {address:#x}");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn big_blobs_in_memory_are_not_copied_by_forks() {
        let storage = Storage::open(None).expect("open");
        let big: Vec<u8> = (0..FORK_EXCLUDED_SIZE + 12_345)
            .map(|i| (i % 253) as u8)
            .collect();
        let small = b"a small blob".to_vec();
        let (big_digest, small_digest) = (
            storage.add_blob(&big).expect("put big"),
            storage.add_blob(&small).expect("put small"),
        );
        let big_kept = storage.blob(&big_digest).expect("get").expect("present");
        let small_kept = storage.blob(&small_digest).expect("get").expect("present");
        assert_eq!(&big_kept[..], &big[..]);
        assert_eq!(&small_kept[..], &small[..]);
        // "dc": do not copy on fork.
        let flags = mapping_flags(big_kept.as_ptr() as usize);
        assert!(flags.split(' ').any(|f| f == "dc"), "{flags}");
        let flags = mapping_flags(small_kept.as_ptr() as usize);
        assert!(!flags.split(' ').any(|f| f == "dc"), "{flags}");
    }

    #[test]
    fn refuses_mismatched_blobs_and_persists_on_disk() {
        let dir = tempfile::tempdir().expect("tempdir");
        let storage = Storage::open(Some(dir.path())).expect("open");
        let good = BlobDigest::of(b"hello");
        assert!(storage.put_blob(&good, b"hellO").is_err());
        assert!(!storage.has_blob(&good).expect("has"));
        storage.put_blob(&good, b"hello").expect("put");
        let reopened = Storage::open(Some(dir.path())).expect("reopen");
        assert_eq!(
            reopened.blob(&good).expect("get").as_deref(),
            Some(&b"hello"[..])
        );
        assert!(reopened.has_blob(&BlobDigest::of(b"")).expect("has empty"));

        // A file changed behind the store's back is not served, and goes.
        let file = dir.path().join("cas").join(format!("{}-5", good.hash));
        std::fs::write(&file, b"jello").expect("tamper");
        assert_eq!(reopened.blob(&good).expect("get"), None);
        assert!(!reopened.has_blob(&good).expect("has"));
    }
}
