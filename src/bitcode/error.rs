//! The one error type of the bitcode reader and writer.

/// What is wrong with a bitcode file. Bit offsets count from the start of the file (for an ELF file, from
/// the start of its `.llvm.lto` section).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BitcodeError {
    #[error("not LLVM bitcode: {0}")]
    NotBitcode(String),
    #[error("bitcode ends early: {needed} more bits needed at bit {at}")]
    Truncated { at: u64, needed: u64 },
    #[error("malformed bitcode at bit {at}: {what}")]
    Malformed { at: u64, what: String },
    #[error("unsupported bitcode at bit {at}: {what}")]
    Unsupported { at: u64, what: String },
}
