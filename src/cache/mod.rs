//! Caches of compile results kept on this machine, consulted before any remote and filled after
//! every successful job, so that relinking an unchanged program does no backend compile at all,
//! whichever mode runs the compiles.
//!
//! Today there is one: [`DiskCache`], a content-addressed store plus an action cache in a
//! directory, shared safely by every link that runs on the machine at once.

pub mod disk;

pub use disk::{DEFAULT_MAX_BYTES, DiskCache, parse_size};
