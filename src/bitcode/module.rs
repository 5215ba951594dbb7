//! The hash a module's bitcode carries (MODULE_CODE_HASH, written when the module has a ThinLTO summary):
//! the same five words an index shard records beside the module's path, so it identifies an input file by
//! content whatever the path recorded for it.

use super::bitstream::{BLOCKINFO_BLOCK_ID, Cursor, Item};
use super::container;
use super::error::BitcodeError;
use super::shard;
use super::shard::MODULE_BLOCK_ID;

/// `[five 32-bit words]`, a record of MODULE_BLOCK itself.
const MODULE_CODE_HASH: u64 = 17;

pub(crate) fn module_hash(bytes: &[u8]) -> Result<Option<[u32; 5]>, BitcodeError> {
    let bitcode = container::module_bitcode(bytes)?;
    let stream = container::bitcode_stream(bitcode)?;
    let mut cursor = Cursor::new(bitcode, stream.range);
    while let Some((bits, item)) = cursor.next()? {
        match item {
            // Only top-level modules: a file may hold several (a split LTO unit writes its ThinLTO part,
            // the one with the hash, first). Their other blocks are skipped by their length words.
            Item::Block(header)
                if header.id == BLOCKINFO_BLOCK_ID
                    || (header.id == MODULE_BLOCK_ID && cursor.block_id().is_none()) =>
            {
                cursor.enter()?;
            }
            Item::Record
                if cursor.block_id() == Some(MODULE_BLOCK_ID)
                    && cursor.record().code() == MODULE_CODE_HASH =>
            {
                return shard::hash_words(bits.start, cursor.record().operands()).map(Some);
            }
            _ => {}
        }
    }
    Ok(None)
}
