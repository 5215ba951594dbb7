//! Validated content digests. Every digest a client sends is checked here once (64 lowercase hex
//! characters of SHA-256, a non-negative size) so that the rest of the server only handles digests
//! that can name a blob, and a malformed one is answered with INVALID_ARGUMENT instead of a lookup.

use bazel_remote_apis::build::bazel::remote::execution::v2::Digest;
use sha2::{Digest as _, Sha256};
use std::fmt;
use tonic::Status;

/// A well-formed SHA-256 digest: lowercase hex hash and size in bytes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlobDigest {
    pub hash: String,
    pub size: u64,
}

impl BlobDigest {
    /// The digest of `data`.
    pub fn of(data: &[u8]) -> Self {
        Self {
            hash: hex::encode(Sha256::digest(data)),
            size: data.len() as u64,
        }
    }

    /// Parses a hash and a size, as found in a proto Digest or a ByteStream resource name.
    pub fn new(hash: &str, size: i64) -> Result<Self, Status> {
        let well_formed = hash.len() == 64
            && hash
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !well_formed {
            return Err(Status::invalid_argument(format!(
                "digest hash {hash:?} is not 64 lowercase hex characters of SHA-256"
            )));
        }
        let size = u64::try_from(size)
            .map_err(|_| Status::invalid_argument(format!("digest size {size} is negative")))?;
        Ok(Self {
            hash: hash.to_owned(),
            size,
        })
    }

    /// Parses a proto Digest.
    pub fn from_proto(digest: &Digest) -> Result<Self, Status> {
        Self::new(&digest.hash, digest.size_bytes)
    }

    /// Parses a required proto Digest field named `field`.
    pub fn required(digest: Option<&Digest>, field: &str) -> Result<Self, Status> {
        digest
            .ok_or_else(|| Status::invalid_argument(format!("{field} is missing")))
            .and_then(Self::from_proto)
    }

    pub fn to_proto(&self) -> Digest {
        Digest {
            hash: self.hash.clone(),
            // Sizes come from an i64 or from the length of data in memory, so they fit.
            size_bytes: i64::try_from(self.size).unwrap_or(i64::MAX),
        }
    }

    /// Checks that `data` is the blob this digest names.
    pub fn verify(&self, data: &[u8]) -> Result<(), Status> {
        let actual = Self::of(data);
        if actual == *self {
            Ok(())
        } else {
            Err(Status::invalid_argument(format!(
                "data does not match its digest: expected {self}, got {actual}"
            )))
        }
    }
}

impl fmt::Display for BlobDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.hash, self.size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_verifies() {
        let d = BlobDigest::of(b"abc");
        assert_eq!(
            d.hash,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(BlobDigest::new(&d.hash, 3).ok(), Some(d.clone()));
        assert!(d.verify(b"abc").is_ok());
        assert!(d.verify(b"abd").is_err());
        assert!(BlobDigest::new(&d.hash.to_uppercase(), 3).is_err());
        assert!(BlobDigest::new("abc", 3).is_err());
        assert!(BlobDigest::new(&d.hash, -1).is_err());
    }
}
