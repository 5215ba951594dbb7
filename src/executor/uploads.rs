//! One upload per blob per link. Jobs that import the same modules need the same blobs at the same
//! time; the first job to need a blob starts its upload (FindMissingBlobs, then the upload of what
//! is missing) and every other job that needs it waits for that same upload instead of sending
//! the blob again. A blob whose upload finished is known present for the rest of the link (until
//! the server says otherwise); a failed upload is forgotten, so a later job tries again.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use futures::FutureExt as _;
use futures::future::{BoxFuture, Shared};

use crate::reapi::{Blob, CallContext, Client, Digest, ReapiError};

/// One upload of some blobs, awaited by every job that needs one of them.
type SharedUpload = Shared<BoxFuture<'static, Result<(), Arc<ReapiError>>>>;

enum State {
    /// In the CAS.
    Present,
    /// Being uploaded.
    InFlight(SharedUpload),
}

/// The blobs of this link and how far their uploads are.
#[derive(Default)]
pub struct Uploads {
    blobs: Arc<Mutex<HashMap<Digest, State>>>,
}

impl Uploads {
    /// Makes sure every blob of `blobs` is in the CAS: uploads those no other job is uploading or
    /// has uploaded, and waits for the others' uploads.
    pub async fn ensure(
        &self,
        client: &Client,
        blobs: &[Blob],
        call: &CallContext,
    ) -> Result<(), Arc<ReapiError>> {
        let mut waits: Vec<SharedUpload> = Vec::new();
        {
            let mut table = self.blobs.lock().map_err(|_| poisoned())?;
            let mut seen = HashSet::new();
            let mut mine: Vec<Blob> = Vec::new();
            for blob in blobs {
                match table.get(&blob.digest) {
                    Some(State::Present) => {}
                    Some(State::InFlight(upload)) => {
                        if seen.insert(&blob.digest) {
                            waits.push(upload.clone());
                        }
                    }
                    None => {
                        if seen.insert(&blob.digest) {
                            mine.push(blob.clone());
                        }
                    }
                }
            }
            if !mine.is_empty() {
                let upload = self.start(client.clone(), mine.clone(), call.clone());
                for blob in mine {
                    table.insert(blob.digest, State::InFlight(upload.clone()));
                }
                waits.push(upload);
            }
        }
        // Several blobs may share one upload: wait for each upload once.
        let mut awaited: Vec<SharedUpload> = Vec::new();
        for upload in waits {
            if !awaited.iter().any(|a| a.ptr_eq(&upload)) {
                awaited.push(upload);
            }
        }
        for result in futures::future::join_all(awaited).await {
            result?;
        }
        Ok(())
    }

    /// Records that `digests` are in the CAS (uploaded or found there by other means).
    pub fn mark_present(&self, digests: impl IntoIterator<Item = Digest>) {
        if let Ok(mut table) = self.blobs.lock() {
            for digest in digests {
                table.insert(digest, State::Present);
            }
        }
    }

    /// Forgets that `digests` are present (the server reported them missing after all).
    pub fn forget(&self, digests: impl IntoIterator<Item = Digest>) {
        if let Ok(mut table) = self.blobs.lock() {
            for digest in digests {
                if matches!(table.get(&digest), Some(State::Present)) {
                    table.remove(&digest);
                }
            }
        }
    }

    /// The upload of `blobs`, which records its outcome in the table when it ends (whichever job
    /// happens to drive it to the end).
    fn start(&self, client: Client, blobs: Vec<Blob>, call: CallContext) -> SharedUpload {
        let table = self.blobs.clone();
        async move {
            let result = client.upload_missing(blobs.clone(), &call).await;
            if let Ok(mut table) = table.lock() {
                for blob in blobs {
                    if result.is_ok() {
                        table.insert(blob.digest, State::Present);
                    } else {
                        table.remove(&blob.digest);
                    }
                }
            }
            result.map(drop).map_err(Arc::new)
        }
        .boxed()
        .shared()
    }
}

fn poisoned() -> Arc<ReapiError> {
    Arc::new(ReapiError::Config(
        "the upload table's lock is poisoned".to_owned(),
    ))
}
