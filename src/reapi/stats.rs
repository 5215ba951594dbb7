//! Transfer counters shared by every clone of a client, read as one snapshot for the run's summary
//! line and its stats JSON.

use std::sync::atomic::{AtomicU64, Ordering};

/// What the client moved and how often it had to retry, since it connected. `bytes_*` count blob
/// contents (logical bytes, what the digests name); `wire_bytes_*` what crossed the network for
/// them (fewer when compressed; more when an interrupted transfer was resumed or read again).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TransferStats {
    pub bytes_uploaded: u64,
    pub wire_bytes_uploaded: u64,
    pub blobs_uploaded: u64,
    pub bytes_downloaded: u64,
    pub wire_bytes_downloaded: u64,
    pub blobs_downloaded: u64,
    /// RPC attempts repeated after a transient failure (including re-attached Execute streams).
    pub rpc_retries: u64,
    /// HTTP/2 connections the client used (each opened only when the earlier ones were full).
    pub connections: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    bytes_uploaded: AtomicU64,
    wire_bytes_uploaded: AtomicU64,
    blobs_uploaded: AtomicU64,
    bytes_downloaded: AtomicU64,
    wire_bytes_downloaded: AtomicU64,
    blobs_downloaded: AtomicU64,
    pub(crate) rpc_retries: AtomicU64,
}

impl Counters {
    /// One blob of `bytes` uploaded, `wire` bytes of it sent.
    pub(crate) fn uploaded(&self, bytes: u64, wire: u64) {
        self.bytes_uploaded.fetch_add(bytes, Ordering::Relaxed);
        self.wire_bytes_uploaded.fetch_add(wire, Ordering::Relaxed);
        self.blobs_uploaded.fetch_add(1, Ordering::Relaxed);
    }

    /// One blob of `bytes` downloaded and verified.
    pub(crate) fn downloaded(&self, bytes: u64) {
        self.bytes_downloaded.fetch_add(bytes, Ordering::Relaxed);
        self.blobs_downloaded.fetch_add(1, Ordering::Relaxed);
    }

    /// `wire` bytes received for blobs (counted as they arrive, whether or not they verify).
    pub(crate) fn received(&self, wire: u64) {
        self.wire_bytes_downloaded
            .fetch_add(wire, Ordering::Relaxed);
    }

    /// The counters now, with the number of connections the client used.
    pub(crate) fn snapshot(&self, connections: u64) -> TransferStats {
        TransferStats {
            bytes_uploaded: self.bytes_uploaded.load(Ordering::Relaxed),
            wire_bytes_uploaded: self.wire_bytes_uploaded.load(Ordering::Relaxed),
            blobs_uploaded: self.blobs_uploaded.load(Ordering::Relaxed),
            bytes_downloaded: self.bytes_downloaded.load(Ordering::Relaxed),
            wire_bytes_downloaded: self.wire_bytes_downloaded.load(Ordering::Relaxed),
            blobs_downloaded: self.blobs_downloaded.load(Ordering::Relaxed),
            rpc_retries: self.rpc_retries.load(Ordering::Relaxed),
            connections,
        }
    }
}
