//! Planning: how each job is presented to whatever runs it — the names of its files, its arguments,
//! and for the remote modes its REAPI Action (layout → merkle input root → Command and Action).

pub mod action;
pub mod args;
pub mod digests;
pub mod environment;
pub mod layout;
pub mod merkle;
pub mod options;
pub mod planner;
pub mod toolchain;
