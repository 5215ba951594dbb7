//! dtlto-reapi: a Distributed ThinLTO distributor for lld that runs every backend compile locally in
//! parallel or as a Remote Execution API v2 action.
//!
//! The modules follow the data flow: `jobs` (parse lld's job file) → `plan` (how each job is presented
//! to what runs it) → `executor` (run it: local, remote, cache-only) → `output` (verify and place what
//! lld reads), driven by `driver`, with `config` and `report` shared by every mode, `reapi` the protocol
//! client, `server` the test server and `link` the linker wrapper that puts the distributor into a link.

pub mod bitcode;
pub mod cache;
pub mod check;
pub mod cli;
pub mod config;
pub mod driver;
pub mod executor;
pub mod explain;
pub mod jobs;
pub mod link;
pub mod logging;
pub mod output;
pub mod plan;
pub mod reapi;
pub mod report;
pub mod server;
pub mod settings;
pub mod trace;
