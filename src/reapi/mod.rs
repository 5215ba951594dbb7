//! The REAPI v2 client: channel and auth, capabilities, CAS, action cache, execution, metadata, retry.
//!
//! This module is transport only: it moves blobs, reads and writes action results and runs actions
//! whose messages the planner built, and knows nothing of ThinLTO. A [`Client`] is connected once
//! per link (reading the server's capabilities), is cheap to clone, and is shared by every job.
//! Every call retries transient failures within its deadline, carries the `RequestMetadata`
//! header and the configured extra headers, and checks what comes back (per-blob statuses,
//! digests of downloaded data).

mod action_cache;
mod bytestream;
mod capabilities;
mod cas;
mod channel;
mod client;
pub mod compression;
mod connections;
mod credentials;
pub mod digest;
mod download;
mod error;
mod execution;
mod headers;
mod metadata;
pub mod retry;
mod stats;
mod upload;

pub use bazel_remote_apis::build::bazel::remote::execution::v2::{ActionResult, ExecuteResponse};
pub use capabilities::{DEFAULT_MAX_BATCH_BYTES, ServerCapabilities};
pub use cas::{Blob, BlobSource, Deferred};
pub use channel::{TlsFiles, check_endpoint};
pub use client::{Client, ConnectionOptions, probe_connection};
pub use connections::CALLS_PER_CONNECTION;
pub use credentials::{HelperArg, parse_helper_arg};
pub use digest::Digest;
pub use error::ReapiError;
pub use execution::Stage;
pub use headers::{check_header_name, parse_header_arg};
pub use metadata::CallContext;
pub use stats::TransferStats;
