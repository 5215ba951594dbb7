//! One upload per blob per link. Jobs that import the same modules need the same blobs at the same
//! time; the first job to need a blob starts its upload and every other job that needs it waits for
//! that same upload instead of sending the blob again. A blob whose upload finished is known
//! present for the rest of the link (until the server says otherwise); a failed upload is
//! forgotten, so a later job tries again.
//!
//! A job's blobs come in two kinds. Files the link found on disk (modules, the toolchain's files)
//! may be in the CAS already, sent by an earlier link: the server is asked first
//! (FindMissingBlobs), and only what it lacks is sent. Blobs made for the job's Action (the Action,
//! its Command and Directories, the rewritten index shard) describe an Action the action cache
//! does not know, so the CAS seldom has them: they are sent without asking, which spares a round
//! trip per job for a few kilobytes sent again in the rare case that they were there. A job's files
//! are checked against the table by digest, and their blobs made only when they must be sent:
//! most of a job's ~100 imports were sent by an earlier job.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::FutureExt as _;
use futures::future::{BoxFuture, Shared};

use crate::plan::digests::FileInfo;
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

/// A blob the link had before it ran (an input file, a toolchain file): its digest at hand, its
/// [`Blob`] made only when it must be sent.
pub trait Found {
    fn digest(&self) -> &Digest;
    fn blob(&self) -> Blob;
}

impl Found for Blob {
    fn digest(&self) -> &Digest {
        &self.digest
    }
    fn blob(&self) -> Blob {
        self.clone()
    }
}

impl Found for Arc<FileInfo> {
    fn digest(&self) -> &Digest {
        &self.digest
    }
    fn blob(&self) -> Blob {
        Blob::from_file(self.local.to_path_buf(), self.digest.clone())
    }
}

impl Uploads {
    /// Makes sure every blob of `found` (asked about first) and `made` (sent without asking) is in
    /// the CAS: uploads those no other job is uploading or has uploaded, and waits for the others'
    /// uploads.
    pub async fn ensure(
        &self,
        client: &Client,
        found: &[impl Found],
        made: &[Blob],
        call: &CallContext,
    ) -> Result<(), Arc<ReapiError>> {
        let mut waits: Vec<SharedUpload> = Vec::new();
        {
            let mut table = self.blobs.lock().map_err(|_| poisoned())?;
            let mut asked: Vec<Blob> = Vec::new();
            let mut sent: Vec<Blob> = Vec::new();
            let wait = |digest: &Digest, waits: &mut Vec<SharedUpload>| match table.get(digest) {
                Some(State::Present) => false,
                Some(State::InFlight(upload)) => {
                    // Several blobs may share one upload: wait for each upload once.
                    if !waits.iter().any(|w| w.ptr_eq(upload)) {
                        waits.push(upload.clone());
                    }
                    false
                }
                None => true,
            };
            for file in found {
                // A digest listed twice is sent once (`upload` drops repeats).
                if wait(file.digest(), &mut waits) {
                    asked.push(file.blob());
                }
            }
            for blob in made {
                if wait(&blob.digest, &mut waits) {
                    sent.push(blob.clone());
                }
            }
            if !asked.is_empty() || !sent.is_empty() {
                let digests: Vec<Digest> = asked
                    .iter()
                    .chain(&sent)
                    .map(|b| b.digest.clone())
                    .collect();
                let upload = self.start(client.clone(), asked, sent, call.clone());
                for digest in digests {
                    table.insert(digest, State::InFlight(upload.clone()));
                }
                waits.push(upload);
            }
        }
        for result in futures::future::join_all(waits).await {
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

    /// The upload of `sent` and of those of `asked` the server lacks, which records its outcome in
    /// the table when it ends (whichever job happens to drive it to the end).
    fn start(
        &self,
        client: Client,
        asked: Vec<Blob>,
        sent: Vec<Blob>,
        call: CallContext,
    ) -> SharedUpload {
        let table = self.blobs.clone();
        async move {
            let digests: Vec<Digest> = asked
                .iter()
                .chain(&sent)
                .map(|b| b.digest.clone())
                .collect();
            let result = client.upload_missing_and(asked, sent, &call).await;
            if let Ok(mut table) = table.lock() {
                for digest in digests {
                    if result.is_ok() {
                        table.insert(digest, State::Present);
                    } else {
                        table.remove(&digest);
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
