//! Execution: runs every job of a link.
//!
//! The files follow a job's way through it: `context` is what every job shares; `scheduler`
//! starts the jobs (bounded concurrency, biggest module first, stop at the first failure or an
//! interrupt); `runner` composes the steps a job may go through as the settings ask — the disk
//! cache (`disk_cache`), the cluster or its action cache (`remote`, with `lookups` and `uploads`), a local
//! compile (`local_runner` around `local` and `child`, whose compilers die with the distributor by
//! way of `reaper`, in the order `slots` decides); with `--strategy=racing`, the cluster and a local
//! compile at once (`racing`); and `outcome` turns how a job ended into its record and the lines the user
//! sees.

mod child;
mod context;
mod disk_cache;
mod health;
mod local;
mod local_runner;
mod lookups;
mod outcome;
mod racing;
#[cfg(unix)]
pub mod reaper;
pub mod remote;
mod runner;
mod scheduler;
mod slots;
pub mod uploads;

pub use context::RunContext;
pub use runner::Runner;
pub use scheduler::run_all;
