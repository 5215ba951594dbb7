//! Planning: how each job is presented to whatever runs it (names of its files, its arguments, and for
//! remote execution its REAPI Action).

pub mod args;
