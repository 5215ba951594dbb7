//! SHA-256 digests as REAPI uses them: a lowercase hex hash plus the size in bytes.
//!
//! Every blob the client sends or receives is named by its digest, so hashing lives in one place:
//! bytes, files (streamed, never read whole into memory) and serialized protobuf messages, whose
//! exact bytes must be kept because the digest is over that encoding.

use std::fmt;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

use sha2::{Digest as _, Sha256};

pub use bazel_remote_apis::build::bazel::remote::execution::v2::Digest;

/// Read size for hashing files: large enough to keep syscalls cheap, small enough to stay cache-friendly.
const FILE_BUFFER: usize = 1 << 20;
/// Smallest read size, for files that are (or claim to be) tiny.
const MIN_FILE_BUFFER: usize = 8 << 10;

/// The digest of `data`.
pub fn of_bytes(data: &[u8]) -> Digest {
    Digest {
        hash: hex::encode(Sha256::digest(data)),
        size_bytes: size_i64(data.len() as u64),
    }
}

/// The digest of the file at `path`, read in chunks. Blocking: call it from `spawn_blocking` or a
/// thread of its own when hashing many files.
pub fn of_file(path: &Path) -> io::Result<Digest> {
    let file = std::fs::File::open(path)?;
    let size = file.metadata()?.len();
    of_reader(file, size)
}

/// The digest of everything `reader` yields, read in chunks (e.g. through an open file handle);
/// `size_hint` (the expected size) bounds the read buffer.
pub fn of_reader(reader: impl Read, size_hint: u64) -> io::Result<Digest> {
    // The buffer is left uninitialized (BufReader): zeroing a 1 MiB buffer, and the page faults
    // of touching it all, cost more than hashing a typical 100 KB object.
    let capacity = usize::try_from(size_hint.saturating_add(1))
        .unwrap_or(FILE_BUFFER)
        .clamp(MIN_FILE_BUFFER, FILE_BUFFER);
    let mut reader = BufReader::with_capacity(capacity, reader);
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    loop {
        let chunk = match reader.fill_buf() {
            Ok([]) => break,
            Ok(chunk) => chunk,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(chunk);
        let n = chunk.len();
        size += n as u64;
        reader.consume(n);
    }
    Ok(Digest {
        hash: hex::encode(hasher.finalize()),
        size_bytes: size_i64(size),
    })
}

/// Serializes `message` and returns its digest together with the exact bytes that were hashed
/// (the bytes to upload: re-encoding later is not guaranteed to give the same bytes).
pub fn of_message(message: &impl prost::Message) -> (Digest, Vec<u8>) {
    let bytes = message.encode_to_vec();
    (of_bytes(&bytes), bytes)
}

/// Whether `digest` is well formed: 64 lowercase hex characters and a non-negative size.
/// Digests that come from a server are checked before they are used in resource names or sizes.
pub fn is_valid(digest: &Digest) -> bool {
    digest.size_bytes >= 0
        && digest.hash.len() == 64
        && digest
            .hash
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The size of a well-formed digest as an unsigned number (a negative size counts as 0).
pub fn size(digest: &Digest) -> u64 {
    u64::try_from(digest.size_bytes).unwrap_or(0)
}

/// `hash/size`, the usual human-readable form of a digest.
pub fn display(digest: &Digest) -> impl fmt::Display + '_ {
    struct Show<'a>(&'a Digest);
    impl fmt::Display for Show<'_> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "{}/{}", self.0.hash, self.0.size_bytes)
        }
    }
    Show(digest)
}

/// Incremental hashing of a blob that arrives in pieces, for verifying downloads.
#[derive(Default)]
pub(crate) struct Hasher {
    sha: Sha256,
    size: u64,
}

impl Hasher {
    pub(crate) fn update(&mut self, data: &[u8]) {
        self.sha.update(data);
        self.size += data.len() as u64;
    }

    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    pub(crate) fn finish(self) -> Digest {
        Digest {
            hash: hex::encode(self.sha.finalize()),
            size_bytes: size_i64(self.size),
        }
    }
}

/// Sizes above `i64::MAX` cannot occur for real data; saturate rather than wrap.
fn size_i64(size: u64) -> i64 {
    i64::try_from(size).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EMPTY: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    #[test]
    fn bytes_file_and_incremental_agree() {
        assert_eq!(of_bytes(b"").hash, EMPTY);
        let data: Vec<u8> = (0..3 * FILE_BUFFER + 17).map(|i| (i % 251) as u8).collect();
        let mut file = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(&mut file, &data).unwrap();
        let from_file = of_file(file.path()).unwrap();
        assert_eq!(from_file, of_bytes(&data));
        assert_eq!(from_file.size_bytes, data.len() as i64);
        let mut hasher = Hasher::default();
        for chunk in data.chunks(1000) {
            hasher.update(chunk);
        }
        assert_eq!(hasher.finish(), from_file);
        // The size hint only sizes the buffer: a wrong one (a file that grew, or shrank) still
        // hashes what is there.
        for hint in [0, 17, data.len() as u64 * 2] {
            assert_eq!(of_reader(&data[..], hint).unwrap(), from_file);
        }
    }

    #[test]
    fn message_digest_is_over_returned_bytes() {
        let (d, bytes) = of_message(&of_bytes(b"x"));
        assert_eq!(d, of_bytes(&bytes));
    }

    #[test]
    fn validity_and_display() {
        let d = of_bytes(b"abc");
        assert!(is_valid(&d));
        assert_eq!(display(&d).to_string(), format!("{}/3", d.hash));
        assert!(!is_valid(&Digest {
            hash: d.hash.to_uppercase(),
            size_bytes: 3
        }));
        assert!(!is_valid(&Digest {
            hash: "../x".into(),
            size_bytes: 3
        }));
        assert!(!is_valid(&Digest {
            hash: d.hash.clone(),
            size_bytes: -1
        }));
        assert_eq!(
            size(&Digest {
                hash: d.hash,
                size_bytes: -5
            }),
            0
        );
    }
}
