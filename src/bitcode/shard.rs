//! The module paths of a ThinLTO index shard: reading its MODULE_STRTAB block (inside MODULE_BLOCK) and
//! rewriting it with new paths. The rewrite re-emits only that block's body, and patches its length word,
//! the length words of the blocks around it and the wrapper's size: every other byte stays as it was, so a
//! backend compile sees the same summary with only the paths changed. Entries whose path is unchanged keep
//! their exact bits; a changed entry is re-encoded with its own abbreviation when the new path fits it
//! (e.g. a char6 array cannot hold '/'), unabbreviated otherwise.

use std::ops::Range;

use super::bitstream::{self, Abbrev, BLOCKINFO_BLOCK_ID, BitReader, BitWriter, Cursor, Item};
use super::container::{self, WRAPPER_SIZE_AT};
use super::{BitcodeError, ModuleEntry};

pub(crate) const MODULE_BLOCK_ID: u64 = 8;
const MODULE_STRTAB_BLOCK_ID: u64 = 19;
/// `[module id, path characters...]`
const MST_CODE_ENTRY: u64 = 1;
/// `[five 32-bit words]`: the hash of the module named by the ENTRY just before.
const MST_CODE_HASH: u64 = 2;

/// A piece of a MODULE_STRTAB body, in order.
enum Piece {
    /// Bits kept verbatim: abbreviation definitions, hashes, records of other kinds.
    Copy(Range<u64>),
    /// The ENTRY record of `entries[index]`, at `bits`, where the block's first `abbrevs` abbreviations
    /// are defined.
    Entry {
        index: usize,
        bits: Range<u64>,
        abbrevs: usize,
    },
}

/// One MODULE_STRTAB block and where it sits.
struct Strtab {
    len_word_at: usize,
    /// Length words of the blocks around it, outermost first.
    enclosing: Vec<usize>,
    body: Range<usize>,
    width: u32,
    /// The block's abbreviations, in ID order.
    abbrevs: Vec<Abbrev>,
    pieces: Vec<Piece>,
}

struct Shard {
    /// The bitstream's bytes in the file.
    stream: Range<usize>,
    entries: Vec<ModuleEntry>,
    tables: Vec<Strtab>,
    wrapped: bool,
}

/// The operands as bytes, or an error naming the record.
fn path_bytes(at: u64, chars: &[u64]) -> Result<Vec<u8>, BitcodeError> {
    chars
        .iter()
        .map(|&c| u8::try_from(c))
        .collect::<Result<_, _>>()
        .map_err(|_| BitcodeError::Malformed {
            at,
            what: "module path character above 255".into(),
        })
}

pub(crate) fn hash_words(at: u64, operands: &[u64]) -> Result<[u32; 5], BitcodeError> {
    let bad = || BitcodeError::Malformed {
        at,
        what: format!(
            "module hash of {} values, not five 32-bit words",
            operands.len()
        ),
    };
    let words: Vec<u32> = operands
        .iter()
        .map(|&w| u32::try_from(w))
        .collect::<Result<_, _>>()
        .map_err(|_| bad())?;
    words.try_into().map_err(|_| bad())
}

/// Reads every MODULE_STRTAB of a shard, remembering what the rewrite needs.
fn scan(bytes: &[u8]) -> Result<Shard, BitcodeError> {
    let stream = container::bitcode_stream(bytes)?;
    let mut cursor = Cursor::new(bytes, stream.range.clone());
    let mut shard = Shard {
        stream: stream.range,
        entries: Vec::new(),
        tables: Vec::new(),
        wrapped: stream.wrapped,
    };
    let mut open: Vec<usize> = Vec::new();
    let mut table: Option<Strtab> = None;
    while let Some((bits, item)) = cursor.next()? {
        match (item, table.as_mut()) {
            (Item::Block(_), Some(_)) => {
                return Err(BitcodeError::Unsupported {
                    at: bits.start,
                    what: "a block inside MODULE_STRTAB".into(),
                });
            }
            (Item::Block(header), None) => {
                if matches!(
                    header.id,
                    BLOCKINFO_BLOCK_ID | MODULE_BLOCK_ID | MODULE_STRTAB_BLOCK_ID
                ) {
                    cursor.enter()?;
                    if header.id == MODULE_STRTAB_BLOCK_ID {
                        table = Some(Strtab {
                            len_word_at: header.len_word_at,
                            enclosing: open.clone(),
                            body: header.body,
                            width: header.width,
                            abbrevs: cursor.abbrevs(),
                            pieces: Vec::new(),
                        });
                    }
                    open.push(header.len_word_at);
                }
            }
            (Item::End, _) => {
                open.pop();
                shard.tables.extend(table.take());
            }
            (Item::DefineAbbrev(abbrev), Some(table)) => {
                table.abbrevs.push(abbrev);
                table.pieces.push(Piece::Copy(bits));
            }
            (Item::Record(record), Some(table)) => {
                match record.code() {
                    MST_CODE_ENTRY => {
                        let (&id, chars) = record.operands().split_first().ok_or_else(|| {
                            BitcodeError::Malformed {
                                at: bits.start,
                                what: "module path entry without a module ID".into(),
                            }
                        })?;
                        shard.entries.push(ModuleEntry {
                            id,
                            path: path_bytes(bits.start, chars)?,
                            hash: None,
                        });
                        let abbrevs = table.abbrevs.len();
                        table.pieces.push(Piece::Entry {
                            index: shard.entries.len() - 1,
                            bits,
                            abbrevs,
                        });
                    }
                    MST_CODE_HASH => {
                        let hash = hash_words(bits.start, record.operands())?;
                        let owner = match table.pieces.last() {
                            Some(Piece::Entry { index, .. }) => shard.entries.get_mut(*index),
                            _ => None,
                        };
                        owner
                            .ok_or_else(|| BitcodeError::Malformed {
                                at: bits.start,
                                what: "module hash that does not follow a module path".into(),
                            })?
                            .hash = Some(hash);
                        table.pieces.push(Piece::Copy(bits));
                    }
                    _ => table.pieces.push(Piece::Copy(bits)),
                }
            }
            // Records and abbreviations of the blocks around MODULE_STRTAB: nothing to do.
            (Item::DefineAbbrev(_) | Item::Record(_), None) => {}
        }
    }
    Ok(shard)
}

pub(crate) fn shard_modules(bytes: &[u8]) -> Result<Vec<ModuleEntry>, BitcodeError> {
    Ok(scan(bytes)?.entries)
}

/// Adds `delta` to the little-endian 32-bit length field at byte `at`.
fn add_to_length(out: &mut [u8], at: usize, delta: i64) -> Result<(), BitcodeError> {
    let too_big = || BitcodeError::Unsupported {
        at: at as u64 * 8,
        what: "rewritten bitcode too large for a length field".into(),
    };
    let word: &mut [u8; 4] = out
        .get_mut(at..at + 4)
        .and_then(|w| w.try_into().ok())
        .ok_or_else(too_big)?;
    let new = u32::try_from(i64::from(u32::from_le_bytes(*word)) + delta).map_err(|_| too_big())?;
    word.copy_from_slice(&new.to_le_bytes());
    Ok(())
}

pub(crate) fn rewrite_shard_paths(
    bytes: &[u8],
    mut new_path: impl FnMut(&ModuleEntry) -> Vec<u8>,
) -> Result<Vec<u8>, BitcodeError> {
    let shard = scan(bytes)?;
    // Asked in file order, whatever order the tables are rewritten in.
    let new_paths: Vec<Vec<u8>> = shard.entries.iter().map(&mut new_path).collect();
    let source = BitReader::new(bytes, shard.stream.clone());
    let mut out = bytes.to_vec();
    let mut total_delta = 0i64;
    // Last table first, so that splicing one leaves the offsets of those before it valid.
    for table in shard.tables.iter().rev() {
        let mut w = BitWriter::default();
        for piece in &table.pieces {
            match piece {
                Piece::Copy(bits) => w.copy(&source, bits.clone())?,
                Piece::Entry {
                    index,
                    bits,
                    abbrevs,
                } => {
                    let entry = &shard.entries[*index];
                    let path = new_paths.get(*index).unwrap_or(&entry.path);
                    if *path == entry.path {
                        w.copy(&source, bits.clone())?;
                    } else {
                        let mut fields = vec![MST_CODE_ENTRY, entry.id];
                        fields.extend(path.iter().map(|&b| u64::from(b)));
                        let abbrevs = table.abbrevs.get(..*abbrevs).unwrap_or_default();
                        bitstream::write_record(&mut w, table.width, abbrevs, &fields, None)?;
                    }
                }
            }
        }
        bitstream::write_end_block(&mut w, table.width);
        let body = w.into_bytes();
        let delta = (body.len() as i64 - table.body.len() as i64) / 4;
        out.splice(table.body.clone(), body);
        for &at in table.enclosing.iter().chain([&table.len_word_at]) {
            add_to_length(&mut out, at, delta)?;
        }
        total_delta += delta;
    }
    if shard.wrapped {
        add_to_length(&mut out, WRAPPER_SIZE_AT, total_delta * 4)?;
    }
    Ok(out)
}
