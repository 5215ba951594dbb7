//! The planning choices a user makes (`--layout`, `--toolchain`), as the settings name them. A leaf
//! module: it imports nothing of the crate, so `settings` depends on the plan's options and never
//! the other way round.

/// Which layout a job's action uses.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum LayoutKind {
    Canonical,
    Mirror,
}

/// How actions get their compiler.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum ToolchainMode {
    /// The compiler and what it needs are inputs of every action.
    Upload,
    /// The workers have the compiler (at `--remote-compiler`, or at the local compiler's path).
    Worker,
}
