//! What clients sent and fetched, counted by the server itself so that tests and benchmarks can
//! check a client's transfers independently of the client's own figures, how many actions actually
//! ran, and how many calls of each RPC arrived (`--stats-json FILE`, written when the server exits).

use super::digest::BlobDigest;
use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct Stats {
    uploads: AtomicU64,
    distinct: Mutex<HashSet<BlobDigest>>,
    bytes_received: AtomicU64,
    bytes_sent: AtomicU64,
    connections: AtomicU64,
    executions: AtomicU64,
    merged_executions: AtomicU64,
    calls: Mutex<BTreeMap<&'static str, u64>>,
}

/// The JSON `--stats-json` writes.
#[derive(Debug, serde::Serialize)]
struct Totals {
    /// Blob uploads that ended with the blob stored: BatchUpdateBlobs entries and ByteStream
    /// writes, including those that found the blob already present.
    blob_uploads: u64,
    /// Distinct blobs among them: equal to `blob_uploads` when no blob was sent twice.
    distinct_blobs_uploaded: u64,
    /// Blob data bytes received (as sent: compressed or not).
    blob_bytes_received: u64,
    /// Blob data bytes sent by BatchReadBlobs and ByteStream reads (as sent).
    blob_bytes_sent: u64,
    /// Connections accepted (TCP or unix socket; each carries any number of HTTP/2 calls).
    connections: u64,
    /// Actions the workers actually ran.
    executions: u64,
    /// Execute calls that attached to an identical action already queued or running instead of
    /// running it again.
    merged_executions: u64,
    /// Calls that arrived, by RPC name (as `--fault-fail` names them), failed ones included.
    calls: BTreeMap<&'static str, u64>,
    /// The server process's peak resident memory (its own, not its actions').
    peak_rss_bytes: u64,
}

impl Stats {
    /// A client finished uploading `digest`.
    pub fn uploaded(&self, digest: &BlobDigest) {
        self.uploads.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut distinct) = self.distinct.lock() {
            distinct.insert(digest.clone());
        }
    }

    /// `bytes` of blob data arrived.
    pub fn received(&self, bytes: usize) {
        self.bytes_received
            .fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// `bytes` of blob data are being sent.
    pub fn sent(&self, bytes: usize) {
        self.bytes_sent.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// A client connected.
    pub fn connection_accepted(&self) {
        self.connections.fetch_add(1, Ordering::Relaxed);
    }

    /// A worker started running an action.
    pub fn executed(&self) {
        self.executions.fetch_add(1, Ordering::Relaxed);
    }

    /// An Execute attached to an identical action in flight.
    pub fn merged(&self) {
        self.merged_executions.fetch_add(1, Ordering::Relaxed);
    }

    /// A call of `rpc` arrived.
    pub fn called(&self, rpc: &'static str) {
        if let Ok(mut calls) = self.calls.lock() {
            *calls.entry(rpc).or_default() += 1;
        }
    }

    /// Writes the totals as JSON to `path`.
    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        let totals = Totals {
            blob_uploads: self.uploads.load(Ordering::Relaxed),
            distinct_blobs_uploaded: self.distinct.lock().map_or(0, |d| d.len() as u64),
            blob_bytes_received: self.bytes_received.load(Ordering::Relaxed),
            blob_bytes_sent: self.bytes_sent.load(Ordering::Relaxed),
            connections: self.connections.load(Ordering::Relaxed),
            executions: self.executions.load(Ordering::Relaxed),
            merged_executions: self.merged_executions.load(Ordering::Relaxed),
            calls: self.calls.lock().map(|c| c.clone()).unwrap_or_default(),
            peak_rss_bytes: peak_rss_bytes(),
        };
        std::fs::write(path, serde_json::to_vec_pretty(&totals)?)
            .map_err(|e| anyhow::anyhow!("cannot write --stats-json {}: {e}", path.display()))
    }
}

/// This process's peak resident memory, from getrusage (0 if unknown).
fn peak_rss_bytes() -> u64 {
    // SAFETY: getrusage fills the struct it is given.
    let usage = unsafe {
        let mut usage = std::mem::zeroed::<libc::rusage>();
        if libc::getrusage(libc::RUSAGE_SELF, &mut usage) != 0 {
            return 0;
        }
        usage
    };
    // Linux reports KiB.
    u64::try_from(usage.ru_maxrss).unwrap_or(0) * 1024
}
