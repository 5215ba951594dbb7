//! dtlto-reapi: a Distributed ThinLTO distributor for lld that runs every backend compile locally in
//! parallel or as a Remote Execution API v2 action.
//!
//! The modules follow the data flow: `jobs` (parse lld's job file) → `plan` (an action per job) →
//! `executor` (run it: local, remote, cache-only) → `output` (verify and write what lld reads), with
//! `config` and `report` shared by every mode, `reapi` the protocol client and `server` the test server.

pub mod bitcode;
pub mod reapi;
pub mod server;
