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
//!
//! Uploads are coalesced across jobs. What a job needs and nobody sends yet is *staged*; the first
//! job that waits for a staged blob sends everything staged by then in one upload (one
//! FindMissingBlobs and one BatchUpdateBlobs, or as many as the server's batch limit asks), at
//! most [`SENDING_AT_ONCE`] such uploads at a time, so that more is staged while they run. Remote
//! jobs stage their blobs while they wait for a turn to execute (`remote::UPLOAD_AHEAD`): in a
//! cold link's steady state, where one job starts as another ends, dozens of jobs share an
//! upload, where each job made its own call before.

use std::sync::{Arc, Mutex};

use futures::FutureExt as _;
use futures::future::{BoxFuture, Shared};
use rustc_hash::FxHashMap;
use tokio::sync::Semaphore;

use crate::plan::digests::FileInfo;
use crate::reapi::{Blob, CallContext, Client, Digest, ReapiError};

/// One upload of some blobs, awaited by every job that needs one of them.
type SharedUpload = Shared<BoxFuture<'static, Result<(), Arc<ReapiError>>>>;

enum State {
    /// In the CAS.
    Present,
    /// Being uploaded, or staged for the next coalesced upload.
    InFlight(SharedUpload),
}

/// The blobs of this link and how far their uploads are.
pub struct Uploads {
    table: Arc<Mutex<Table>>,
    /// Turns to send a coalesced upload: while they are all taken, what jobs need goes on being
    /// staged, and goes in one upload at the next turn.
    sending: Arc<Semaphore>,
}

/// Coalesced uploads in flight at once, at most. Two, so that a large upload does not hold back
/// every other job's few kilobytes.
const SENDING_AT_ONCE: usize = 2;

impl Default for Uploads {
    fn default() -> Self {
        Uploads {
            table: Arc::default(),
            sending: Arc::new(Semaphore::new(SENDING_AT_ONCE)),
        }
    }
}

#[derive(Default)]
struct Table {
    /// FxHash: the keys are digests, looked up ~100 times per job.
    states: FxHashMap<Digest, State>,
    /// The blobs staged for the next coalesced upload (see [`Uploads::stage`]).
    staged: Option<StagedBlobs>,
}

/// Blobs staged to go out together.
struct StagedBlobs {
    /// Files, which the server is asked about first.
    asked: Vec<Blob>,
    /// Blobs made for Actions, sent without asking.
    sent: Vec<Blob>,
    /// The upload that will send them.
    upload: SharedUpload,
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
    /// the CAS: sends those nobody has sent or staged, together with everything other jobs have
    /// staged by then, and waits for the uploads that carry the others.
    pub async fn ensure(
        &self,
        client: &Client,
        found: &[impl Found],
        made: &[Blob],
        call: &CallContext,
    ) -> Result<(), Arc<ReapiError>> {
        let staged = self.stage(client, found, made, call)?;
        self.wait_for(staged, client, found, made, call).await
    }

    /// Stages the blobs of `found` and `made` that nobody has sent or staged for the next
    /// coalesced upload, without sending anything: the first job that waits for one of them
    /// ([`Uploads::wait_for`]) sends them all in one upload (one FindMissingBlobs and one
    /// BatchUpdateBlobs for many jobs, where each job made its own calls before). Remote jobs
    /// stage their blobs while they wait for a turn to execute.
    pub fn stage(
        &self,
        client: &Client,
        found: &[impl Found],
        made: &[Blob],
        call: &CallContext,
    ) -> Result<Staged, Arc<ReapiError>> {
        let waits = self.register(client, found, made, call, Sending::Staged)?;
        Ok(Staged { waits })
    }

    /// Waits until the blobs of a job's [`Staged`] are in the CAS, sending what is still staged.
    ///
    /// A coalesced upload carries other jobs' blobs; if it fails for a reason of its own (a file
    /// that changed since it was hashed, say) rather than the cluster's, this job's blobs (`found`
    /// and `made`, as staged) are sent again alone, so that one job's bad input fails that job
    /// only.
    pub async fn wait_for(
        &self,
        staged: Staged,
        client: &Client,
        found: &[impl Found],
        made: &[Blob],
        call: &CallContext,
    ) -> Result<(), Arc<ReapiError>> {
        match wait_all(staged.waits).await {
            Err(e) if !e.is_infrastructure() => {
                let waits = self.register(client, found, made, call, Sending::Alone)?;
                wait_all(waits).await
            }
            done => done,
        }
    }

    /// Records that `digests` are in the CAS (uploaded or found there by other means).
    pub fn mark_present(&self, digests: impl IntoIterator<Item = Digest>) {
        if let Ok(mut table) = self.table.lock() {
            for digest in digests {
                table.states.insert(digest, State::Present);
            }
        }
    }

    /// Forgets that `digests` are present (the server reported them missing after all).
    pub fn forget(&self, digests: impl IntoIterator<Item = Digest>) {
        if let Ok(mut table) = self.table.lock() {
            for digest in digests {
                if matches!(table.states.get(&digest), Some(State::Present)) {
                    table.states.remove(&digest);
                }
            }
        }
    }

    /// Puts the blobs no upload carries yet into an upload (the staged one, or one of their own
    /// with [`Sending::Alone`]); returns the uploads that carry the blobs not yet present.
    fn register(
        &self,
        client: &Client,
        found: &[impl Found],
        made: &[Blob],
        call: &CallContext,
        sending: Sending,
    ) -> Result<Vec<SharedUpload>, Arc<ReapiError>> {
        let mut guard = self.table.lock().map_err(|_| poisoned())?;
        let table = &mut *guard;
        let mut waits: Vec<SharedUpload> = Vec::new();
        let mut asked: Vec<Blob> = Vec::new();
        let mut sent: Vec<Blob> = Vec::new();
        let mut wait = |digest: &Digest| match table.states.get(digest) {
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
            if wait(file.digest()) {
                asked.push(file.blob());
            }
        }
        for blob in made {
            if wait(&blob.digest) {
                sent.push(blob.clone());
            }
        }
        if asked.is_empty() && sent.is_empty() {
            return Ok(waits);
        }
        let digests: Vec<Digest> = asked
            .iter()
            .chain(&sent)
            .map(|b| b.digest.clone())
            .collect();
        let upload = match sending {
            Sending::Alone => {
                let (table, client, call) = (self.table.clone(), client.clone(), call.clone());
                async move { send(&table, &client, asked, sent, &call).await }
                    .boxed()
                    .shared()
            }
            Sending::Staged => {
                let staged = table.staged.get_or_insert_with(|| StagedBlobs {
                    asked: Vec::new(),
                    sent: Vec::new(),
                    upload: self.staged_upload(client.clone(), call),
                });
                staged.asked.extend(asked);
                staged.sent.extend(sent);
                staged.upload.clone()
            }
        };
        for digest in digests {
            table.states.insert(digest, State::InFlight(upload.clone()));
        }
        if !waits.iter().any(|w| w.ptr_eq(&upload)) {
            waits.push(upload);
        }
        Ok(waits)
    }

    /// An upload of what is staged: when a job first waits for it, it waits for a turn to send,
    /// then takes the staged blobs out of the table (everything staged until then goes with it)
    /// and sends them.
    fn staged_upload(&self, client: Client, call: &CallContext) -> SharedUpload {
        let (table, sending, call) = (self.table.clone(), self.sending.clone(), call.clone());
        async move {
            let _turn = sending.acquire().await;
            let staged = (table.lock().ok()).and_then(|mut table| table.staged.take());
            let (asked, sent) = staged.map(|s| (s.asked, s.sent)).unwrap_or_default();
            send(&table, &client, asked, sent, &call).await
        }
        .boxed()
        .shared()
    }
}

/// How a job's blobs go out.
#[derive(Clone, Copy)]
enum Sending {
    /// Staged, with what other jobs staged, when a job first waits for one of them.
    Staged,
    /// In an upload of their own.
    Alone,
}

/// The uploads that carry a job's blobs, once staged: see [`Uploads::wait_for`].
pub struct Staged {
    waits: Vec<SharedUpload>,
}

/// Uploads `sent` and those of `asked` the server lacks, and records the outcome in `table` for
/// whichever jobs wait on them.
async fn send(
    table: &Mutex<Table>,
    client: &Client,
    asked: Vec<Blob>,
    sent: Vec<Blob>,
    call: &CallContext,
) -> Result<(), Arc<ReapiError>> {
    let digests: Vec<Digest> = asked
        .iter()
        .chain(&sent)
        .map(|b| b.digest.clone())
        .collect();
    let result = client.upload_missing_and(asked, sent, call).await;
    if let Ok(mut table) = table.lock() {
        for digest in digests {
            if result.is_ok() {
                table.states.insert(digest, State::Present);
            } else {
                table.states.remove(&digest);
            }
        }
    }
    result.map(drop).map_err(Arc::new)
}

async fn wait_all(waits: Vec<SharedUpload>) -> Result<(), Arc<ReapiError>> {
    for result in futures::future::join_all(waits).await {
        result?;
    }
    Ok(())
}

fn poisoned() -> Arc<ReapiError> {
    Arc::new(ReapiError::Config(
        "the upload table's lock is poisoned".to_owned(),
    ))
}
