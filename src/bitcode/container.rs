//! Where the bitstream lives inside a file. LLVM bitcode is either raw (starting with 'BC' 0xC0DE), or
//! behind the wrapper header (magic 0x0B17C0DE, then version, offset and size of the bitcode, CPU type:
//! five little-endian 32-bit words) that Darwin tools write; a FatLTO object is an ELF file carrying the
//! bitcode in its `.llvm.lto` section.

use std::ops::Range;

use object::{Object, ObjectSection};

use super::error::BitcodeError;

const RAW_MAGIC: [u8; 4] = [b'B', b'C', 0xC0, 0xDE];
const WRAPPER_MAGIC: u32 = 0x0B17_C0DE;
const WRAPPER_HEADER_LEN: usize = 20;
/// Byte offset of the wrapper's size field.
pub(crate) const WRAPPER_SIZE_AT: usize = 12;
const ELF_MAGIC: &[u8] = b"\x7fELF";
const FAT_LTO_SECTION: &str = ".llvm.lto";

/// A bitstream inside a buffer.
pub(crate) struct Stream {
    /// The bytes after the 'BC' 0xC0DE magic, up to the end of the bitcode.
    pub(crate) range: Range<usize>,
    /// Whether the buffer starts with the wrapper header, whose size field covers the bitcode.
    pub(crate) wrapped: bool,
}

fn le32(bytes: &[u8], at: usize) -> Option<u32> {
    let word = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes(word.try_into().ok()?))
}

/// The bitstream of raw or wrapped bitcode.
pub(crate) fn bitcode_stream(bytes: &[u8]) -> Result<Stream, BitcodeError> {
    let wrapped = le32(bytes, 0) == Some(WRAPPER_MAGIC);
    let range = if wrapped {
        let field = |at| le32(bytes, at).map(|value| value as usize);
        let (offset, size) = field(8)
            .zip(field(WRAPPER_SIZE_AT))
            .filter(|_| bytes.len() >= WRAPPER_HEADER_LEN)
            .ok_or_else(|| BitcodeError::NotBitcode("truncated bitcode wrapper header".into()))?;
        let end = offset.checked_add(size).filter(|&end| end <= bytes.len()).ok_or_else(|| {
            BitcodeError::NotBitcode(format!(
                "the wrapper header places the bitcode at bytes {offset}+{size}, past the end of the {} byte file",
                bytes.len()
            ))
        })?;
        offset..end
    } else {
        0..bytes.len()
    };
    if bytes.get(range.start..range.start.saturating_add(4)) != Some(&RAW_MAGIC[..]) {
        return Err(BitcodeError::NotBitcode("no 'BC' 0xC0DE magic".into()));
    }
    if range.len() % 4 != 0 {
        return Err(BitcodeError::NotBitcode(format!(
            "{} bytes of bitcode, not a multiple of 4",
            range.len()
        )));
    }
    Ok(Stream {
        range: range.start + RAW_MAGIC.len()..range.end,
        wrapped,
    })
}

/// The bitcode of a module file: the file itself, or the `.llvm.lto` section of an ELF file.
pub(crate) fn module_bitcode(bytes: &[u8]) -> Result<&[u8], BitcodeError> {
    if !bytes.starts_with(ELF_MAGIC) {
        return Ok(bytes);
    }
    let not_fat = |what: String| BitcodeError::NotBitcode(format!("ELF file {what}"));
    let elf =
        object::File::parse(bytes).map_err(|e| not_fat(format!("that cannot be read: {e}")))?;
    let section = elf
        .section_by_name(FAT_LTO_SECTION)
        .ok_or_else(|| not_fat(format!("without a {FAT_LTO_SECTION} section")))?;
    section.data().map_err(|e| {
        not_fat(format!(
            "whose {FAT_LTO_SECTION} section cannot be read: {e}"
        ))
    })
}
