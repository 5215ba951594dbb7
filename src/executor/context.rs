//! What every job of a run shares: the job file, the reporter, the cancellation of the link and the
//! trace.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::jobs::JobFile;
use crate::report::Reporter;
use crate::trace::Trace;

/// What every job of a run shares; cheap to clone (every job's task holds one).
#[derive(Clone)]
pub struct RunContext {
    pub job_file: Arc<JobFile>,
    pub reporter: Arc<Reporter>,
    /// Cancelled on SIGINT/SIGTERM, and on the first failure unless `keep_going`.
    pub cancel: CancellationToken,
    pub keep_going: bool,
    /// `--trace`: the spans of every job's phases.
    pub trace: Option<Arc<Trace>>,
}
