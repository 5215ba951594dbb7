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
use prost::Message;
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use tonic::Status;

/// One namespace of digest-keyed values.
enum Store {
    Memory(RwLock<HashMap<BlobDigest, Arc<[u8]>>>),
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

    fn get(&self, key: &BlobDigest) -> Result<Option<Arc<[u8]>>, Status> {
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

    fn put(&self, key: &BlobDigest, data: Arc<[u8]>) -> Result<(), Status> {
        match self {
            Store::Memory(map) => {
                map.write().map_err(poisoned)?.insert(key.clone(), data);
                Ok(())
            }
            Store::Disk(dir) => {
                // Write beside the final name and rename, so a crash never leaves a torn value.
                let io = |e: std::io::Error| Status::internal(format!("cannot store {key}: {e}"));
                let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(io)?;
                tmp.write_all(&data).map_err(io)?;
                tmp.persist(Self::file(dir, key)).map_err(|e| io(e.error))?;
                Ok(())
            }
        }
    }
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
    pub fn blob(&self, digest: &BlobDigest) -> Result<Option<Arc<[u8]>>, Status> {
        if digest.size == 0 {
            // Every empty blob reads as empty, but only the digest of no bytes is valid.
            return Ok((*digest == BlobDigest::of(&[])).then(|| Arc::from(&[][..])));
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
        self.cas.put(digest, data.into())
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
        self.action_cache.put(action, result.encode_to_vec().into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
