//! Caches of compile results kept on this machine, consulted before any remote and filled after
//! every successful job, so that relinking an unchanged program does no backend compile at all,
//! whichever mode runs the compiles.
//!
//! [`DiskCache`] is a content-addressed store plus an action cache in a directory, shared safely by
//! every link that runs on the machine at once; [`DigestCache`] remembers the digests of files that
//! do not change between links (the compiler, the link's input objects), so they are not hashed again.

pub mod digest_cache;
pub mod disk;

pub use digest_cache::DigestCache;

pub use disk::{DEFAULT_MAX_BYTES, DiskCache, parse_size};

/// Why a cache file or directory could have been written by another user, if so (see
/// `platform::foreign_writable`). Both caches then refuse it.
pub(crate) use crate::platform::foreign_writable;
