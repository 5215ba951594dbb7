//! dtlto-reapi: a Distributed ThinLTO distributor for lld that runs every backend compile locally in
//! parallel or as a Remote Execution API v2 action.
//!
//! The modules follow the data flow: `jobs` (parse lld's job file) → `plan` (how each job is presented
//! to what runs it) → `executor` (run it: local, remote, cache-only) → `staging` (verify and place what
//! lld reads), driven by `distribute`, with `config`, `report` and `stats` shared by every mode, `reapi`
//! the protocol client, `server` the test server and `wrapper` the linker wrapper that puts the
//! distributor into a link.
//!
//! Public are the modules the binary (`main.rs`) and the integration tests use; the rest are the
//! crate's own.

pub(crate) mod advice;
pub mod bitcode;
pub mod cache;
pub mod check;
pub mod cli;
pub mod config;
pub mod distribute;
pub mod executor;
pub mod explain;
pub(crate) mod jobs;
pub mod logging;
pub(crate) mod plan;
pub(crate) mod platform;
pub mod reapi;
pub(crate) mod remote_options;
pub(crate) mod report;
pub(crate) mod response_files;
pub(crate) mod runtime;
#[cfg(unix)]
pub mod server;
pub mod settings;
pub(crate) mod staging;
pub(crate) mod stats;
pub(crate) mod trace;
pub mod wrapper;
