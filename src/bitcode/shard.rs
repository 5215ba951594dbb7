//! The module table of a ThinLTO index shard: reading its MODULE_STRTAB block (inside MODULE_BLOCK), and
//! rewriting the shard so that it depends only on the modules' new names.
//!
//! lld numbers the modules of a shard in the sorted order of their *original* paths, and the summary
//! block (GLOBALVAL_SUMMARY, a sibling of MODULE_STRTAB) refers to modules by those numbers and orders
//! its records by them. The rewrite therefore renames the modules, renumbers them in the byte order of
//! the new paths, re-emits MODULE_STRTAB in that order, and hands the summary block to `summary` to
//! remap and reorder. Only those two block bodies are re-emitted; the length words of the blocks around
//! them and the wrapper's size are patched, and every other byte stays as it was. Shards hold no
//! absolute offsets into the stream (VSTOFFSET, function offsets), so the length words are all there is
//! to fix.

use std::ops::Range;

use super::bitstream::{
    self, Abbrev, BLOCKINFO_BLOCK_ID, BitReader, BitWriter, Body, BodyItem, Cursor, Emit, InScope,
    Item, Record,
};
use super::container::{self, WRAPPER_SIZE_AT};
use super::error::BitcodeError;
use super::summary;

/// One module recorded in an index shard's MODULE_STRTAB.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleEntry {
    /// The module's ID in the summary, which refers to modules by ID only.
    pub id: u64,
    /// The path the backend compile opens the module by, as the link named it (arbitrary bytes).
    pub path: Vec<u8>,
    /// The module's hash, [`super::module_hash`] of its bitcode (compare with [`ModuleEntry::matches_hash`]);
    /// `None` if the shard records none.
    pub hash: Option<[u32; 5]>,
}

impl ModuleEntry {
    /// Whether `module_hash` (a module's own [`super::module_hash`]) is this entry's.
    ///
    /// Tolerates a defect of LLVM 22.1.8's shard writer, seen with a non-ASCII module path: each byte
    /// ≥ 0x80 is written sign-extended, so stray 1 bits are ORed into the next bits of the stream, up to
    /// 32 bits on; they corrupt the path and can reach the first hash word (never the other four). So
    /// the last four words must be equal and the first may only have extra bits set; the 128 bits left
    /// still identify a module.
    pub fn matches_hash(&self, module_hash: &[u32; 5]) -> bool {
        self.hash.is_some_and(|recorded| {
            recorded[1..] == module_hash[1..] && module_hash[0] & !recorded[0] == 0
        })
    }
}

pub(crate) const MODULE_BLOCK_ID: u64 = 8;
const MODULE_STRTAB_BLOCK_ID: u64 = 19;
const GLOBALVAL_SUMMARY_BLOCK_ID: u64 = 20;
/// `[module id, path characters...]`
const MST_CODE_ENTRY: u64 = 1;
/// `[five 32-bit words]`: the hash of the module named by the ENTRY just before.
const MST_CODE_HASH: u64 = 2;

/// One block whose body may be re-emitted.
pub(crate) struct Block {
    len_word_at: usize,
    /// Length words of the blocks around it, outermost first.
    enclosing: Vec<usize>,
    body: Range<usize>,
    width: u32,
    /// The abbreviations in scope on entry (BLOCKINFO's for this block ID).
    inherited: Vec<Abbrev>,
    /// For MODULE_STRTAB, everything but its ENTRY and HASH records (which become `Shard::entries`).
    pub(crate) contents: Body,
}

/// A shard read for rewriting: its module entries, and the blocks a rewrite re-emits.
pub(crate) struct Shard {
    /// The bitstream's bytes in the file.
    stream: Range<usize>,
    wrapped: bool,
    pub(crate) entries: Vec<ModuleEntry>,
    tables: Vec<Block>,
    summaries: Vec<Block>,
}

/// The operands as bytes, or an error naming the record.
fn path_bytes(at: u64, chars: &[u64]) -> Result<Vec<u8>, BitcodeError> {
    // One allocation of the right size: collecting through a `Result` knows no length, and grew
    // each path from 8 bytes, five allocations for the ~100 paths of every shard.
    let mut path = Vec::with_capacity(chars.len());
    for &c in chars {
        path.push(u8::try_from(c).map_err(|_| BitcodeError::Malformed {
            at,
            what: "module path character above 255".into(),
        })?);
    }
    Ok(path)
}

pub(crate) fn hash_words(at: u64, operands: &[u64]) -> Result<[u32; 5], BitcodeError> {
    let bad = || BitcodeError::Malformed {
        at,
        what: format!(
            "module hash of {} values, not five 32-bit words",
            operands.len()
        ),
    };
    let operands: &[u64; 5] = operands.try_into().map_err(|_| bad())?;
    let mut words = [0u32; 5];
    for (word, &operand) in words.iter_mut().zip(operands) {
        *word = u32::try_from(operand).map_err(|_| bad())?;
    }
    Ok(words)
}

/// Adds a MODULE_STRTAB record to the entries it describes; other records stay in the block's items.
/// `awaiting_hash` says whether the previous item was an ENTRY, which a HASH must directly follow.
fn module_record(
    entries: &mut Vec<ModuleEntry>,
    table: &mut Block,
    awaiting_hash: &mut bool,
    at: u64,
    record: Record<'_>,
) -> Result<(), BitcodeError> {
    let follows_entry = std::mem::replace(awaiting_hash, false);
    match record.code() {
        MST_CODE_ENTRY => {
            let (&id, chars) =
                record
                    .operands()
                    .split_first()
                    .ok_or_else(|| BitcodeError::Malformed {
                        at,
                        what: "module path entry without a module ID".into(),
                    })?;
            entries.push(ModuleEntry {
                id,
                path: path_bytes(at, chars)?,
                hash: None,
            });
            *awaiting_hash = true;
        }
        MST_CODE_HASH => {
            let hash = hash_words(at, record.operands())?;
            entries
                .last_mut()
                .filter(|_| follows_entry)
                .ok_or_else(|| BitcodeError::Malformed {
                    at,
                    what: "module hash that does not follow a module path".into(),
                })?
                .hash = Some(hash);
        }
        _ => table.contents.push_record(at, record)?,
    }
    Ok(())
}

/// Reads every MODULE_STRTAB of a shard and, with `summaries`, every summary block in a MODULE_BLOCK.
fn scan(bytes: &[u8], summaries: bool) -> Result<Shard, BitcodeError> {
    let stream = container::bitcode_stream(bytes)?;
    let mut cursor = Cursor::new(bytes, stream.range.clone());
    let mut shard = Shard {
        stream: stream.range,
        wrapped: stream.wrapped,
        entries: Vec::new(),
        tables: Vec::new(),
        summaries: Vec::new(),
    };
    let mut open: Vec<usize> = Vec::new();
    // The block being read, and whether it is a MODULE_STRTAB.
    let mut current: Option<(Block, bool)> = None;
    let mut awaiting_hash = false;
    while let Some((bits, item)) = cursor.next()? {
        match (item, current.as_mut()) {
            (Item::Block(_), Some(_)) => {
                return Err(BitcodeError::Unsupported {
                    at: bits.start,
                    what: "a block inside MODULE_STRTAB or the summary".into(),
                });
            }
            (Item::Block(header), None) => {
                let in_module = cursor.block_id() == Some(MODULE_BLOCK_ID);
                let is_table = header.id == MODULE_STRTAB_BLOCK_ID;
                let is_summary = summaries && in_module && header.id == GLOBALVAL_SUMMARY_BLOCK_ID;
                if matches!(header.id, BLOCKINFO_BLOCK_ID | MODULE_BLOCK_ID)
                    || is_table
                    || is_summary
                {
                    cursor.enter()?;
                    if is_table || is_summary {
                        // A table's entries become `Shard::entries`, not its contents.
                        let contents = if is_summary {
                            Body::for_bytes(header.body.len())
                        } else {
                            Body::default()
                        };
                        let block = Block {
                            len_word_at: header.len_word_at,
                            enclosing: open.clone(),
                            body: header.body,
                            width: header.width,
                            inherited: cursor.abbrevs(),
                            contents,
                        };
                        current = Some((block, is_table));
                    }
                    open.push(header.len_word_at);
                }
            }
            (Item::End, _) => {
                open.pop();
                match current.take() {
                    Some((block, true)) => shard.tables.push(block),
                    Some((block, false)) => shard.summaries.push(block),
                    None => {}
                }
            }
            (Item::DefineAbbrev(abbrev), Some((block, _))) => {
                awaiting_hash = false;
                block.contents.items.push(BodyItem::Define { bits, abbrev });
            }
            (Item::Record, Some((block, true))) => {
                module_record(
                    &mut shard.entries,
                    block,
                    &mut awaiting_hash,
                    bits.start,
                    cursor.record(),
                )?;
            }
            (Item::Record, Some((block, false))) => {
                block.contents.push_record(bits.start, cursor.record())?;
            }
            // Records and abbreviations of the blocks around: nothing to do.
            (Item::DefineAbbrev(_) | Item::Record, None) => {}
        }
    }
    Ok(shard)
}

pub(crate) fn shard_modules(bytes: &[u8]) -> Result<Vec<ModuleEntry>, BitcodeError> {
    Ok(scan(bytes, false)?.entries)
}

/// A block's new body being written: its abbreviation definitions copied from the original
/// (`source`), its records written with the smallest abbreviation in scope, then END_BLOCK.
struct BodyWriter<'r, 'a> {
    source: &'r BitReader<'a>,
    w: BitWriter,
    in_scope: InScope,
}

impl<'r, 'a> BodyWriter<'r, 'a> {
    fn new(source: &'r BitReader<'a>, block: &Block) -> Self {
        BodyWriter {
            source,
            // About the size of the body it replaces: the new one differs only in its names.
            w: BitWriter::with_capacity(block.body.len() + block.body.len() / 4),
            in_scope: InScope::new(block.width, &block.inherited),
        }
    }

    fn define(&mut self, bits: &Range<u64>, abbrev: &Abbrev) -> Result<(), BitcodeError> {
        self.w.copy(self.source, bits.clone())?;
        self.in_scope.push(abbrev.clone());
        Ok(())
    }

    fn record(&mut self, fields: &[u64]) -> Result<(), BitcodeError> {
        bitstream::write_record(&mut self.w, &self.in_scope, fields, None)
    }

    fn finish(mut self) -> Vec<u8> {
        bitstream::write_end_block(&mut self.w, self.in_scope.width);
        self.w.into_bytes()
    }
}

/// The new body of `block`: `emits` (whose buffered records are in `buffer`), then END_BLOCK.
fn body(
    source: &BitReader<'_>,
    block: &Block,
    emits: Vec<Emit<'_>>,
    buffer: &[u64],
) -> Result<Vec<u8>, BitcodeError> {
    let mut out = BodyWriter::new(source, block);
    for emit in emits {
        match emit {
            Emit::Define(bits, abbrev) => out.define(bits, abbrev)?,
            Emit::Record(fields) => out.record(fields)?,
            Emit::Buffered(range) => out.record(&buffer[range])?,
        }
    }
    Ok(out.finish())
}

/// MODULE_STRTAB's new body: its abbreviation definitions as they were, then an ENTRY (and its
/// HASH, if recorded) per module of `renamed`, numbered in that order. Written as it goes, with one
/// buffer for every record's fields: a shard names a hundred modules or more, each path ~70
/// characters, one field each.
fn table_body(
    source: &BitReader<'_>,
    table: &Block,
    renamed: &[(impl AsRef<[u8]>, &ModuleEntry)],
) -> Result<Vec<u8>, BitcodeError> {
    let mut out = BodyWriter::new(source, table);
    for item in &table.contents.items {
        if let BodyItem::Define { bits, abbrev } = item {
            out.define(bits, abbrev)?;
        }
    }
    let mut fields: Vec<u64> = Vec::new();
    for (new_id, (path, entry)) in renamed.iter().enumerate() {
        fields.clear();
        fields.extend([MST_CODE_ENTRY, new_id as u64]);
        fields.extend(path.as_ref().iter().map(|&b| u64::from(b)));
        out.record(&fields)?;
        if let Some(hash) = entry.hash {
            fields.clear();
            fields.push(MST_CODE_HASH);
            fields.extend(hash.map(u64::from));
            out.record(&fields)?;
        }
    }
    Ok(out.finish())
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

/// `bytes` with the bodies of some blocks replaced, and the length words that cover them adjusted.
fn splice(
    bytes: &[u8],
    wrapped: bool,
    mut bodies: Vec<(&Block, Vec<u8>)>,
) -> Result<Vec<u8>, BitcodeError> {
    // Built in one pass (a `Vec::splice` per block moved the rest of the shard each time), then the
    // length words are patched at their new offsets: a word before a replaced body moves by what
    // the bodies before it added, and every block's length word precedes its body.
    bodies.sort_by_key(|(block, _)| block.body.start);
    let added: usize = bodies.iter().map(|(_, body)| body.len()).sum();
    let mut out = Vec::with_capacity(bytes.len() + added);
    let mut copied = 0;
    for (block, body) in &bodies {
        out.extend_from_slice(&bytes[copied..block.body.start]);
        out.extend_from_slice(body);
        copied = block.body.end;
    }
    out.extend_from_slice(&bytes[copied..]);
    let moved = |at: usize| -> i64 {
        bodies
            .iter()
            .take_while(|(block, _)| block.body.end <= at)
            .map(|(block, body)| body.len() as i64 - block.body.len() as i64)
            .sum()
    };
    let mut total_delta = 0i64;
    for (block, body) in &bodies {
        let delta = (body.len() as i64 - block.body.len() as i64) / 4;
        for &at in block.enclosing.iter().chain([&block.len_word_at]) {
            add_to_length(&mut out, (at as i64 + moved(at)) as usize, delta)?;
        }
        total_delta += delta;
    }
    if wrapped {
        add_to_length(&mut out, WRAPPER_SIZE_AT, total_delta * 4)?;
    }
    Ok(out)
}

fn unsupported(at: usize, what: impl Into<String>) -> BitcodeError {
    BitcodeError::Unsupported {
        at: at as u64 * 8,
        what: what.into(),
    }
}

/// Reads a shard's MODULE_STRTAB and summary block, for [`canonicalize`].
pub(crate) fn read_for_rewrite(bytes: &[u8]) -> Result<Shard, BitcodeError> {
    scan(bytes, true)
}

pub(crate) fn canonicalize_shard<P: AsRef<[u8]>>(
    bytes: &[u8],
    new_path: impl FnMut(&ModuleEntry) -> P,
) -> Result<Vec<u8>, BitcodeError> {
    canonicalize(bytes, &read_for_rewrite(bytes)?, new_path)
}

/// `bytes`, read as `shard`, canonicalized (see [`super::canonicalize_shard`]).
pub(crate) fn canonicalize<P: AsRef<[u8]>>(
    bytes: &[u8],
    shard: &Shard,
    mut new_path: impl FnMut(&ModuleEntry) -> P,
) -> Result<Vec<u8>, BitcodeError> {
    let [table] = &shard.tables[..] else {
        return Err(unsupported(
            shard.stream.start,
            format!("{} MODULE_STRTAB blocks, not one", shard.tables.len()),
        ));
    };
    if shard.summaries.len() > 1 {
        return Err(unsupported(
            shard.stream.start,
            "more than one summary block",
        ));
    }
    if let Some(BodyItem::Record { at, fields }) = table
        .contents
        .items
        .iter()
        .find(|item| matches!(item, BodyItem::Record { .. }))
    {
        return Err(BitcodeError::Unsupported {
            at: *at,
            what: format!(
                "MODULE_STRTAB record of code {}",
                table.contents.record(fields).code()
            ),
        });
    }

    // Asked in file order; the new IDs follow the byte order of the new paths.
    let mut renamed: Vec<(P, &ModuleEntry)> = shard
        .entries
        .iter()
        .map(|entry| (new_path(entry), entry))
        .collect();
    // Unstable is enough: two equal paths are an error below.
    renamed.sort_unstable_by(|a, b| a.0.as_ref().cmp(b.0.as_ref()));
    let mut module_ids = summary::IdMap::with_capacity(renamed.len());
    for (new_id, pair) in renamed.iter().enumerate() {
        if !module_ids.insert(pair.1.id, new_id as u64) {
            return Err(BitcodeError::Malformed {
                at: table.body.start as u64 * 8,
                what: format!("module ID {} recorded twice", pair.1.id),
            });
        }
    }
    if let Some(pair) = renamed
        .windows(2)
        .find(|pair| pair[0].0.as_ref() == pair[1].0.as_ref())
    {
        return Err(unsupported(
            table.body.start,
            format!(
                "two modules renamed to the same path {:?}",
                String::from_utf8_lossy(pair[0].0.as_ref())
            ),
        ));
    }

    let source = BitReader::new(bytes, shard.stream.clone());
    let mut bodies = vec![(table, table_body(&source, table, &renamed)?)];
    for summary in &shard.summaries {
        let (emits, buffer) = summary::canonical(&summary.contents, &module_ids)?;
        bodies.push((summary, body(&source, summary, emits, &buffer)?));
    }
    splice(bytes, shard.wrapped, bodies)
}
