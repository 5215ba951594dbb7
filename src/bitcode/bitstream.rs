//! The LLVM bitstream container, independent of what the records mean: a bit reader and writer, abbreviation
//! definitions (fixed, VBR, array, char6, blob operands), BLOCKINFO, and a cursor that walks blocks and
//! records one item at a time, skipping the blocks its caller does not enter by their length words.
//!
//! Everything read from the stream is untrusted: every length is checked against the input left before
//! anything is allocated, nesting depth and abbreviation sizes are bounded, and every loop consumes input,
//! so any byte string ends in a result or a [`BitcodeError`] in time proportional to its length.
//! Positions are absolute bit offsets in the buffer the stream lives in; 32-bit alignment is relative to
//! the stream's first byte, as in LLVM.

use std::collections::HashMap;
use std::ops::Range;
use std::rc::Rc;

use super::error::BitcodeError;

/// Abbreviation IDs with a fixed meaning in every block.
const END_BLOCK: u64 = 0;
const ENTER_SUBBLOCK: u64 = 1;
const DEFINE_ABBREV: u64 = 2;
const UNABBREV_RECORD: u64 = 3;
/// The first ID an abbreviation definition gets.
const FIRST_DEFINED_ABBREV: u64 = 4;

/// The block that defines abbreviations for other blocks, and its record naming the block they are for.
pub(crate) const BLOCKINFO_BLOCK_ID: u64 = 0;
const BLOCKINFO_CODE_SETBID: u64 = 1;

/// Abbreviation ID width outside every block.
const TOP_LEVEL_ABBREV_WIDTH: u32 = 2;
/// Deeper nesting than this is refused (LLVM itself nests a handful of levels).
const MAX_DEPTH: usize = 64;
/// Operands per abbreviation; LLVM's own have a dozen at most. Bounding this keeps the work per record
/// proportional to the bits it occupies even for abbreviations made only of literals.
const MAX_ABBREV_OPS: u64 = 256;
/// Outside every block, fewer bytes than the smallest possible block are trailing padding (LLVM tolerates
/// the same, e.g. from archivers that pad members).
const MIN_BLOCK_BYTES: u64 = 12;

pub(super) fn malformed(at: u64, what: impl Into<String>) -> BitcodeError {
    BitcodeError::Malformed {
        at,
        what: what.into(),
    }
}

pub(super) fn unsupported(at: u64, what: impl Into<String>) -> BitcodeError {
    BitcodeError::Unsupported {
        at,
        what: what.into(),
    }
}

/// Reads fields of up to 64 bits, least significant bit first, from `data[start..end]`.
#[derive(Clone)]
pub(crate) struct BitReader<'a> {
    data: &'a [u8],
    start: u64,
    pos: u64,
    end: u64,
}

impl<'a> BitReader<'a> {
    /// A reader of `data[range]`, positioned at its start. `range` must lie inside `data`.
    pub(crate) fn new(data: &'a [u8], range: Range<usize>) -> Self {
        let end = (range.end.min(data.len()) as u64) * 8;
        let start = (range.start as u64 * 8).min(end);
        BitReader {
            data,
            start,
            pos: start,
            end,
        }
    }

    pub(crate) fn pos(&self) -> u64 {
        self.pos
    }

    fn remaining(&self) -> u64 {
        self.end - self.pos
    }

    fn need(&self, bits: u64) -> Result<(), BitcodeError> {
        if bits > self.remaining() {
            return Err(BitcodeError::Truncated {
                at: self.pos,
                needed: bits - self.remaining(),
            });
        }
        Ok(())
    }

    /// A fixed-width field; `width` is at most 64.
    #[inline]
    pub(crate) fn read(&mut self, width: u32) -> Result<u64, BitcodeError> {
        self.need(u64::from(width))?;
        let first = (self.pos / 8) as usize;
        let bit = (self.pos % 8) as u32;
        // Fast path: the field lies within eight bytes of the buffer, loaded as one word.
        if bit + width <= 64
            && let Some(word) = self.data.get(first..first + 8)
        {
            let word = u64::from_le_bytes(word.try_into().unwrap_or_default()) >> bit;
            self.pos += u64::from(width);
            return Ok(word & low_bits(width));
        }
        let mut value = 0u64;
        let mut got = 0;
        while got < width {
            let byte = *self
                .data
                .get((self.pos / 8) as usize)
                .ok_or(BitcodeError::Truncated {
                    at: self.pos,
                    needed: 8,
                })?;
            let bit = (self.pos % 8) as u32;
            let take = (8 - bit).min(width - got);
            let chunk = (u64::from(byte) >> bit) & ((1u64 << take) - 1);
            value |= chunk << got;
            got += take;
            self.pos += u64::from(take);
        }
        Ok(value)
    }

    /// A fixed-width field the caller made sure is there ([`BitReader::need`]); past the end it
    /// would read as zero.
    fn read_present(&mut self, width: u32) -> u64 {
        self.read(width).unwrap_or_default()
    }

    /// A variable-width field in chunks of `width` bits (2 to 64), the top bit of each meaning "more follows".
    #[inline]
    pub(crate) fn read_vbr(&mut self, width: u32) -> Result<u64, BitcodeError> {
        // Most values of a shard fit one chunk.
        let at = self.pos;
        let first = self.read(width)?;
        let more = 1u64 << (width - 1);
        if first & more == 0 {
            return Ok(first);
        }
        self.read_vbr_rest(at, first & (more - 1), width)
    }

    /// The rest of a VBR at bit `at` whose first chunk held `value` and said more follows.
    fn read_vbr_rest(&mut self, at: u64, mut value: u64, width: u32) -> Result<u64, BitcodeError> {
        let more = 1u64 << (width - 1);
        let mut shift = width - 1;
        loop {
            let chunk = self.read(width)?;
            let bits = chunk & (more - 1);
            if bits != 0 {
                if shift > bits.leading_zeros() {
                    return Err(malformed(at, "VBR value does not fit in 64 bits"));
                }
                value |= bits << shift;
            }
            if chunk & more == 0 {
                return Ok(value);
            }
            // Zero continuation chunks are legal; each one consumes input, so this ends.
            shift = shift.saturating_add(width - 1);
        }
    }

    /// Skips to the next multiple of 32 bits from the stream's start.
    pub(crate) fn align32(&mut self) -> Result<(), BitcodeError> {
        let aligned = self.start + (self.pos - self.start).div_ceil(32) * 32;
        self.need(aligned - self.pos)?;
        self.pos = aligned;
        Ok(())
    }

    /// `len` whole bytes; the reader must be at a byte boundary.
    fn read_bytes(&mut self, len: u64) -> Result<&'a [u8], BitcodeError> {
        self.need(len.saturating_mul(8))?;
        let first = (self.pos / 8) as usize;
        let bytes = self
            .data
            .get(first..first + len as usize)
            .ok_or(BitcodeError::Truncated {
                at: self.pos,
                needed: len * 8,
            })?;
        self.pos += len * 8;
        Ok(bytes)
    }

    fn seek(&mut self, pos: u64) {
        self.pos = pos.clamp(self.start, self.end);
    }
}

/// The mask of the low `width` bits (`width` at most 64).
fn low_bits(width: u32) -> u64 {
    u64::MAX.checked_shr(64 - width).unwrap_or(0)
}

/// Appends fields least significant bit first; the first bit written is aligned for `align32`.
///
/// Bits gather in a 64-bit word that goes to the bytes when full: a shard rewrite writes some ten
/// thousand fields of a few bits each (module paths in 6-bit characters), and growing the byte
/// vector for each took a third of the rewrite's time.
#[derive(Default)]
pub(crate) struct BitWriter {
    /// The full words written, as bytes.
    bytes: Vec<u8>,
    /// The bits after them, `pending_bits` (fewer than 64) of them, least significant first.
    pending: u64,
    pending_bits: u32,
    /// All bits written.
    bits: u64,
}

impl BitWriter {
    /// A writer with room for `bytes` bytes before it grows.
    pub(crate) fn with_capacity(bytes: usize) -> BitWriter {
        BitWriter {
            bytes: Vec::with_capacity(bytes),
            ..BitWriter::default()
        }
    }

    /// Writes the low `width` bits of `value` (`width` at most 64; higher bits are ignored).
    pub(crate) fn write(&mut self, value: u64, width: u32) {
        if width == 0 {
            return;
        }
        let value = value & low_bits(width);
        self.bits += u64::from(width);
        let free = 64 - self.pending_bits;
        // `pending_bits` < 64, so the shift keeps the bits that fit.
        self.pending |= value << self.pending_bits;
        if width < free {
            self.pending_bits += width;
        } else {
            self.bytes.extend_from_slice(&self.pending.to_le_bytes());
            self.pending = value.checked_shr(free).unwrap_or(0);
            self.pending_bits = width - free;
        }
    }

    pub(crate) fn write_vbr(&mut self, mut value: u64, width: u32) {
        let more = 1u64 << (width - 1);
        while value >= more {
            self.write((value & (more - 1)) | more, width);
            value >>= width - 1;
        }
        self.write(value, width);
    }

    pub(crate) fn align32(&mut self) {
        let pad = self.bits.next_multiple_of(32) - self.bits;
        self.write(0, pad as u32);
    }

    fn write_bytes(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write(u64::from(byte), 8);
        }
    }

    /// Copies the bits `range` of a stream verbatim.
    pub(crate) fn copy(
        &mut self,
        from: &BitReader<'_>,
        range: Range<u64>,
    ) -> Result<(), BitcodeError> {
        let mut reader = from.clone();
        reader.seek(range.start);
        let mut left = range.end.saturating_sub(range.start);
        while left > 0 {
            let width = left.min(64) as u32;
            self.write(reader.read(width)?, width);
            left -= u64::from(width);
        }
        Ok(())
    }

    pub(crate) fn into_bytes(mut self) -> Vec<u8> {
        let pending = self.pending_bits.div_ceil(8) as usize;
        self.bytes
            .extend_from_slice(&self.pending.to_le_bytes()[..pending]);
        self.bytes
    }
}

/// One operand of an abbreviation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Literal(u64),
    Fixed(u32),
    Vbr(u32),
    /// A VBR6 count, then that many values encoded as the operand that follows.
    Array,
    Char6,
    /// A VBR6 byte count, 32-bit alignment, the bytes, 32-bit alignment.
    Blob,
}

/// A validated abbreviation: scalars, optionally ending in `Array, element` or `Blob`; the first operand
/// (the record code) is a scalar.
pub(crate) type Abbrev = Rc<[Op]>;

const CHAR6: &[u8; 64] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._";

/// Each byte's position in [`CHAR6`], or `NOT_CHAR6`: a table, because a shard rewrite asks this
/// of every character of every module path, several times.
const CHAR6_CODES: [u8; 256] = {
    let mut codes = [NOT_CHAR6; 256];
    let mut i = 0;
    while i < CHAR6.len() {
        codes[CHAR6[i] as usize] = i as u8;
        i += 1;
    }
    codes
};
const NOT_CHAR6: u8 = u8::MAX;

/// The position of `value` in [`CHAR6`], if it is there.
fn char6_code(value: u64) -> Option<u64> {
    let code = *CHAR6_CODES.get(usize::try_from(value).ok()?)?;
    (code != NOT_CHAR6).then_some(u64::from(code))
}

/// Splits an abbreviation into its scalar operands and its tail (`[]`, `[Array, element]` or `[Blob]`).
fn split_tail(ops: &[Op]) -> (&[Op], &[Op]) {
    let scalars = ops
        .iter()
        .take_while(|op| !matches!(op, Op::Array | Op::Blob))
        .count();
    ops.split_at(scalars)
}

fn read_abbrev(r: &mut BitReader<'_>) -> Result<Abbrev, BitcodeError> {
    let at = r.pos();
    let count = r.read_vbr(5)?;
    if count == 0 || count > MAX_ABBREV_OPS {
        return Err(unsupported(
            at,
            format!("abbreviation with {count} operands"),
        ));
    }
    let mut ops = Vec::with_capacity(count as usize);
    for _ in 0..count {
        if r.read(1)? == 1 {
            ops.push(Op::Literal(r.read_vbr(8)?));
            continue;
        }
        let op_at = r.pos();
        ops.push(match r.read(3)? {
            encoding @ (1 | 2) => {
                let width = r.read_vbr(5)?;
                // A zero-width field always reads as zero: LLVM turns it into a literal too.
                match (encoding, width) {
                    (_, 0) => Op::Literal(0),
                    (1, 1..=64) => Op::Fixed(width as u32),
                    (2, 2..=64) => Op::Vbr(width as u32),
                    _ => {
                        return Err(unsupported(
                            op_at,
                            format!("abbreviation operand of width {width}"),
                        ));
                    }
                }
            }
            3 => Op::Array,
            4 => Op::Char6,
            5 => Op::Blob,
            other => {
                return Err(malformed(
                    op_at,
                    format!("abbreviation operand encoding {other}"),
                ));
            }
        });
    }
    let (scalars, tail) = split_tail(&ops);
    let tail_ok = match tail {
        [] | [Op::Blob] => true,
        [Op::Array, element] => matches!(element, Op::Fixed(_) | Op::Vbr(_) | Op::Char6),
        _ => false,
    };
    if scalars.is_empty() || !tail_ok {
        return Err(malformed(at, format!("invalid abbreviation {ops:?}")));
    }
    Ok(ops.into())
}

#[inline]
fn read_scalar(r: &mut BitReader<'_>, op: Op) -> Result<u64, BitcodeError> {
    match op {
        Op::Literal(value) => Ok(value),
        Op::Fixed(width) => r.read(width),
        Op::Vbr(width) => r.read_vbr(width),
        Op::Char6 => Ok(u64::from(CHAR6[r.read(6)? as usize])),
        // `split_tail` keeps arrays and blobs out of the scalars.
        Op::Array | Op::Blob => Err(malformed(r.pos(), "array or blob used as a scalar")),
    }
}

/// The fewest bits one value encoded as `op` takes, to bound an array count by the input left.
fn min_bits(op: Op) -> u64 {
    match op {
        Op::Fixed(width) | Op::Vbr(width) => u64::from(width),
        Op::Char6 => 6,
        Op::Literal(_) | Op::Array | Op::Blob => 0,
    }
}

/// The record a [`Cursor`] has just read: its code and operands, and its blob if its abbreviation
/// has one. Borrowed: the cursor reads every record into the same buffer, as a shard rewrite reads
/// some five hundred records per shard.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Record<'r> {
    /// The record code, then the operands.
    pub(crate) fields: &'r [u64],
    pub(crate) blob: Option<&'r [u8]>,
}

impl<'r> Record<'r> {
    pub(crate) fn code(&self) -> u64 {
        self.fields.first().copied().unwrap_or_default()
    }

    pub(crate) fn operands(&self) -> &'r [u64] {
        self.fields.get(1..).unwrap_or_default()
    }
}

/// Reads an unabbreviated record's fields into `fields` (emptied first).
fn read_unabbreviated(r: &mut BitReader<'_>, fields: &mut Vec<u64>) -> Result<(), BitcodeError> {
    fields.clear();
    let code = r.read_vbr(6)?;
    let count = r.read_vbr(6)?;
    r.need(count.saturating_mul(6))?;
    fields.reserve(count as usize + 1);
    fields.push(code);
    for _ in 0..count {
        fields.push(r.read_vbr(6)?);
    }
    Ok(())
}

/// Reads a record with abbreviation `abbrev` into `fields` (emptied first); returns its blob.
fn read_abbreviated<'a>(
    r: &mut BitReader<'a>,
    abbrev: &[Op],
    fields: &mut Vec<u64>,
) -> Result<Option<&'a [u8]>, BitcodeError> {
    fields.clear();
    let (scalars, tail) = split_tail(abbrev);
    for &op in scalars {
        fields.push(read_scalar(r, op)?);
    }
    match *tail {
        [Op::Array, element] => {
            let count = r.read_vbr(6)?;
            r.need(count.saturating_mul(min_bits(element)))?;
            fields.reserve(count as usize);
            // Fixed-width elements (a module path's characters) are all there once `need` said so,
            // and are read as many to a word as fit, as `write_array` writes them.
            match element {
                Op::Fixed(width) if width <= 32 => {
                    read_packed(r, width, count, fields, |code| code);
                }
                Op::Char6 => {
                    read_packed(r, 6, count, fields, |code| {
                        u64::from(CHAR6[code as usize & 63])
                    });
                }
                _ => {
                    for _ in 0..count {
                        fields.push(read_scalar(r, element)?);
                    }
                }
            }
        }
        [Op::Blob] => {
            let len = r.read_vbr(6)?;
            r.align32()?;
            let blob = r.read_bytes(len)?;
            r.align32()?;
            return Ok(Some(blob));
        }
        _ => {}
    }
    Ok(None)
}

/// Appends `count` elements of `width` bits (at most 32), which the caller made sure are there, to
/// `fields`, each as `value` makes it of its bits: one read per 64-bit word's worth.
fn read_packed(
    r: &mut BitReader<'_>,
    width: u32,
    count: u64,
    fields: &mut Vec<u64>,
    value: impl Fn(u64) -> u64,
) {
    let per_word = u64::from(64 / width);
    let mut left = count;
    while left > 0 {
        let now = left.min(per_word);
        let word = r.read_present(width * now as u32);
        fields.extend((0..now).map(|i| value((word >> (i as u32 * width)) & low_bits(width))));
        left -= now;
    }
}

fn write_scalar(w: &mut BitWriter, op: Op, value: u64) {
    match op {
        Op::Fixed(width) => w.write(value, width),
        Op::Vbr(width) => w.write_vbr(value, width),
        Op::Char6 => w.write(char6_code(value).unwrap_or_default(), 6),
        Op::Literal(_) | Op::Array | Op::Blob => {}
    }
}

/// Writes the elements of an array. Fixed-width and char6 elements (a module path is some seventy
/// char6 characters) are packed into as few 64-bit writes as they fit, instead of a write per
/// element; the bits are the same.
fn write_array(w: &mut BitWriter, element: Op, values: &[u64]) {
    /// Writes `values` as `width`-bit codes, as many to a write as fit in 64 bits.
    fn packed(w: &mut BitWriter, width: u32, values: &[u64], code: impl Fn(u64) -> u64) {
        for chunk in values.chunks((64 / width) as usize) {
            let mut word = 0u64;
            for (i, &value) in chunk.iter().enumerate() {
                word |= (code(value) & low_bits(width)) << (i as u32 * width);
            }
            w.write(word, width * chunk.len() as u32);
        }
    }
    match element {
        Op::Fixed(width) if width <= 32 => packed(w, width, values, |value| value),
        Op::Char6 => packed(w, 6, values, |value| char6_code(value).unwrap_or_default()),
        _ => {
            for &value in values {
                write_scalar(w, element, value);
            }
        }
    }
}

/// The bits `value` takes as a VBR of `width`-bit chunks.
fn vbr_bits(value: u64, width: u32) -> u64 {
    let significant = 64 - u64::from(value.leading_zeros());
    let per_chunk = u64::from(width - 1);
    // Most values fit one chunk: no division for them (`perf annotate` found the division among
    // the hottest instructions of writing a record).
    if significant <= per_chunk {
        return u64::from(width);
    }
    significant.div_ceil(per_chunk) * u64::from(width)
}

/// The bits `value` takes as operand `op`; `None` if it does not fit it.
fn scalar_size(op: Op, value: u64) -> Option<u64> {
    match op {
        Op::Literal(literal) => (value == literal).then_some(0),
        Op::Fixed(width) => (width == 64 || value >> width == 0).then_some(u64::from(width)),
        Op::Vbr(width) => Some(vbr_bits(value, width)),
        Op::Char6 => char6_code(value).map(|_| 6),
        Op::Array | Op::Blob => None,
    }
}

/// The bits [`write_abbreviated`] writes for the record with abbreviation `ops`, counted from a
/// 32-bit boundary (which places a blob's padding); `None` if the record does not fit `ops`. One
/// pass over the fields: a module path is tried against three string abbreviations.
fn abbreviated_size(width: u32, ops: &[Op], fields: &[u64], blob: Option<&[u8]>) -> Option<u64> {
    let (scalars, tail) = split_tail(ops);
    let (head, rest) = fields.split_at_checked(scalars.len())?;
    let mut bits = u64::from(width);
    for (&op, &value) in scalars.iter().zip(head) {
        bits += scalar_size(op, value)?;
    }
    match (tail, blob) {
        ([], None) if rest.is_empty() => {}
        ([Op::Array, element], None) => {
            let count = rest.len() as u64;
            bits += vbr_bits(count, 6);
            bits += match *element {
                // Whether every element fits, in one vectorized OR instead of a shift per element.
                Op::Fixed(element_width) => {
                    let all = rest.iter().fold(0, |all, &value| all | value);
                    scalar_size(Op::Fixed(element_width), all)? * count
                }
                Op::Char6 => {
                    let all = rest.iter().all(|&value| char6_code(value).is_some());
                    all.then_some(6 * count)?
                }
                element => rest
                    .iter()
                    .map(|&value| scalar_size(element, value))
                    .sum::<Option<u64>>()?,
            };
        }
        ([Op::Blob], Some(bytes)) if rest.is_empty() => {
            bits = (bits + vbr_bits(bytes.len() as u64, 6)).next_multiple_of(32);
            bits = (bits + bytes.len() as u64 * 8).next_multiple_of(32);
        }
        _ => return None,
    }
    Some(bits)
}

/// Writes a record with abbreviation `id` (`ops`), which it fits.
fn write_abbreviated(
    w: &mut BitWriter,
    width: u32,
    id: u64,
    ops: &[Op],
    fields: &[u64],
    blob: Option<&[u8]>,
) {
    w.write(id, width);
    let (scalars, tail) = split_tail(ops);
    for (&op, &value) in scalars.iter().zip(fields) {
        write_scalar(w, op, value);
    }
    let rest = fields.get(scalars.len()..).unwrap_or_default();
    match (tail, blob) {
        ([Op::Array, element], _) => {
            w.write_vbr(rest.len() as u64, 6);
            write_array(w, *element, rest);
        }
        ([Op::Blob], Some(bytes)) => {
            w.write_vbr(bytes.len() as u64, 6);
            w.align32();
            w.write_bytes(bytes);
            w.align32();
        }
        _ => {}
    }
}

/// Record codes below this get their own list of abbreviations to try (LLVM's summary and module
/// table codes are all below it).
const INDEXED_CODES: usize = 64;

/// The abbreviations in scope of a block being written, with the ones worth trying for each record
/// code: a summary block has dozens in scope and nearly all of them begin with a literal code, so a
/// record need not be tried against every one.
pub(crate) struct InScope {
    /// Abbreviation ID width of the block.
    pub(crate) width: u32,
    /// In ID order, the first having ID [`FIRST_DEFINED_ABBREV`].
    abbrevs: Vec<Abbrev>,
    /// For each code below [`INDEXED_CODES`], the positions in `abbrevs` of those that begin with that
    /// literal code or with no literal, in ID order; IDs too wide for the block are left out.
    by_code: Vec<Vec<usize>>,
    /// Likewise for every other code: all usable ones that do not begin with a literal below
    /// [`INDEXED_CODES`].
    others: Vec<usize>,
}

impl InScope {
    /// A block with `width`-bit abbreviation IDs and the abbreviations `inherited` (BLOCKINFO's).
    pub(crate) fn new(width: u32, inherited: &[Abbrev]) -> InScope {
        let mut in_scope = InScope {
            width,
            abbrevs: Vec::with_capacity(inherited.len()),
            by_code: vec![Vec::new(); INDEXED_CODES],
            others: Vec::new(),
        };
        for abbrev in inherited {
            in_scope.push(abbrev.clone());
        }
        in_scope
    }

    /// Defines the next abbreviation.
    pub(crate) fn push(&mut self, abbrev: Abbrev) {
        let at = self.abbrevs.len();
        let usable = (FIRST_DEFINED_ABBREV + at as u64) >> self.width == 0;
        if usable {
            match abbrev.first() {
                Some(&Op::Literal(code)) if code < INDEXED_CODES as u64 => {
                    self.by_code[code as usize].push(at)
                }
                Some(Op::Literal(_)) => self.others.push(at),
                _ => {
                    self.by_code.iter_mut().for_each(|list| list.push(at));
                    self.others.push(at);
                }
            }
        }
        self.abbrevs.push(abbrev);
    }

    /// The abbreviations that may fit a record of `code`, with their IDs, in ID order.
    fn candidates(&self, code: Option<u64>) -> impl Iterator<Item = (u64, &Abbrev)> {
        let list = match code {
            Some(code) if code < INDEXED_CODES as u64 => &self.by_code[code as usize],
            _ => &self.others,
        };
        list.iter()
            .map(|&at| (FIRST_DEFINED_ABBREV + at as u64, &self.abbrevs[at]))
    }
}

/// Writes a record in a block whose abbreviations are `in_scope`: with the one that fits it in the
/// fewest bits, as LLVM's writers choose (e.g. char6 over 7-bit over 8-bit characters),
/// unabbreviated if none fits. Only a blob needs an abbreviation.
pub(crate) fn write_record(
    w: &mut BitWriter,
    in_scope: &InScope,
    fields: &[u64],
    blob: Option<&[u8]>,
) -> Result<(), BitcodeError> {
    let width = in_scope.width;
    let mut best: Option<(u64, &Abbrev, u64)> = None;
    for (id, ops) in in_scope.candidates(fields.first().copied()) {
        // Codes past the indexed ones are still tried against every literal.
        let other_code =
            matches!(ops.first(), Some(Op::Literal(code)) if fields.first() != Some(code));
        if other_code {
            continue;
        }
        let Some(bits) = abbreviated_size(width, ops, fields, blob) else {
            continue;
        };
        // Ties go to the later one: LLVM defines its string abbreviations widest first (8-bit, 7-bit,
        // char6) and writes an empty string as char6.
        if best.is_none_or(|(_, _, best_bits)| bits <= best_bits) {
            best = Some((id, ops, bits));
        }
    }
    if let Some((id, ops, _)) = best {
        write_abbreviated(w, width, id, ops, fields, blob);
        return Ok(());
    }
    let (&code, operands) = fields
        .split_first()
        .ok_or_else(|| unsupported(w.bits, "a record without a code"))?;
    if blob.is_some() {
        return Err(unsupported(w.bits, "a blob without an abbreviation for it"));
    }
    w.write(UNABBREV_RECORD, width);
    w.write_vbr(code, 6);
    w.write_vbr(operands.len() as u64, 6);
    for &value in operands {
        w.write_vbr(value, 6);
    }
    Ok(())
}

/// Ends a block whose abbreviation IDs are `width` bits wide.
pub(crate) fn write_end_block(w: &mut BitWriter, width: u32) {
    w.write(END_BLOCK, width);
    w.align32();
}

/// A sub-block the cursor has just read the header of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BlockHeader {
    pub(crate) id: u64,
    /// Abbreviation ID width inside the block.
    pub(crate) width: u32,
    /// Byte offset of the block's length word (its size in 32-bit words, after that word).
    pub(crate) len_word_at: usize,
    /// Byte range of the body: everything after the length word, up to and including END_BLOCK.
    pub(crate) body: Range<usize>,
}

/// One step of a walk through the stream.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Item {
    /// A sub-block starts; the cursor skips it unless [`Cursor::enter`] is called before the next step.
    Block(BlockHeader),
    /// The current block ends.
    End,
    /// An abbreviation was defined for the current block (or, in BLOCKINFO, for another one).
    DefineAbbrev(Abbrev),
    /// A record of the current block, read by [`Cursor::record`].
    Record,
}

struct Scope {
    id: u64,
    width: u32,
    end: u64,
    /// How many of BLOCKINFO's abbreviations for this block ID existed on entry: they come first.
    inherited: usize,
    local: Vec<Abbrev>,
}

/// Walks a stream item by item, tracking abbreviations, BLOCKINFO and the enclosing blocks.
pub(crate) struct Cursor<'a> {
    reader: BitReader<'a>,
    scopes: Vec<Scope>,
    blockinfo: HashMap<u64, Vec<Abbrev>>,
    /// The block ID the current BLOCKINFO block is defining abbreviations for.
    setbid: Option<u64>,
    pending: Option<BlockHeader>,
    /// The last record read.
    fields: Vec<u64>,
    blob: Option<&'a [u8]>,
}

impl<'a> Cursor<'a> {
    /// A cursor at the start of `data[range]`: the first bit after the 'BC' 0xC0DE magic.
    pub(crate) fn new(data: &'a [u8], range: Range<usize>) -> Self {
        Cursor {
            reader: BitReader::new(data, range),
            scopes: Vec::new(),
            blockinfo: HashMap::new(),
            setbid: None,
            pending: None,
            fields: Vec::new(),
            blob: None,
        }
    }

    /// The record the last [`Cursor::next`] returned ([`Item::Record`]).
    pub(crate) fn record(&self) -> Record<'_> {
        Record {
            fields: &self.fields,
            blob: self.blob,
        }
    }

    /// The abbreviations of the innermost block so far, in ID order.
    pub(crate) fn abbrevs(&self) -> Vec<Abbrev> {
        let Some(scope) = self.scopes.last() else {
            return Vec::new();
        };
        let inherited = self
            .blockinfo
            .get(&scope.id)
            .and_then(|all| all.get(..scope.inherited))
            .unwrap_or_default();
        inherited.iter().chain(&scope.local).cloned().collect()
    }

    /// The ID of the innermost block the cursor is in; `None` outside every block.
    pub(crate) fn block_id(&self) -> Option<u64> {
        self.scopes.last().map(|scope| scope.id)
    }

    /// The next item and the bits it occupied (for a block, its header up to the length word; for
    /// END_BLOCK, with the alignment after it); `None` at the end of the stream.
    pub(crate) fn next(&mut self) -> Result<Option<(Range<u64>, Item)>, BitcodeError> {
        if let Some(skipped) = self.pending.take() {
            self.reader.seek(skipped.body.end as u64 * 8);
        }
        let start = self.reader.pos();
        if self.scopes.is_empty() && self.reader.remaining() < MIN_BLOCK_BYTES * 8 {
            return Ok(None);
        }
        let width = self
            .scopes
            .last()
            .map_or(TOP_LEVEL_ABBREV_WIDTH, |scope| scope.width);
        let id = self.reader.read(width)?;
        let item = match id {
            ENTER_SUBBLOCK => self.read_block_header(start)?,
            _ if self.scopes.is_empty() => {
                return Err(malformed(
                    start,
                    format!("abbreviation ID {id} outside every block"),
                ));
            }
            END_BLOCK => {
                self.reader.align32()?;
                let end = self.scopes.pop().map_or(0, |scope| scope.end);
                if self.reader.pos() != end {
                    return Err(malformed(
                        start,
                        format!(
                            "END_BLOCK ends the block at bit {}, but its length word says bit {end}",
                            self.reader.pos()
                        ),
                    ));
                }
                Item::End
            }
            DEFINE_ABBREV => {
                let abbrev = read_abbrev(&mut self.reader)?;
                self.define(start, abbrev.clone())?;
                Item::DefineAbbrev(abbrev)
            }
            UNABBREV_RECORD => {
                read_unabbreviated(&mut self.reader, &mut self.fields)?;
                self.blob = None;
                self.after_record()?
            }
            _ => {
                let abbrev = self
                    .abbrev(id)
                    .ok_or_else(|| malformed(start, format!("undefined abbreviation ID {id}")))?;
                self.blob = read_abbreviated(&mut self.reader, &abbrev, &mut self.fields)?;
                self.after_record()?
            }
        };
        Ok(Some((start..self.reader.pos(), item)))
    }

    /// Enters the block the last [`Cursor::next`] returned.
    pub(crate) fn enter(&mut self) -> Result<(), BitcodeError> {
        let at = self.reader.pos();
        let header = self
            .pending
            .take()
            .ok_or_else(|| malformed(at, "no block to enter"))?;
        if self.scopes.len() >= MAX_DEPTH {
            return Err(unsupported(
                at,
                format!("blocks nested deeper than {MAX_DEPTH}"),
            ));
        }
        if header.id == BLOCKINFO_BLOCK_ID {
            self.setbid = None;
        }
        self.scopes.push(Scope {
            id: header.id,
            width: header.width,
            end: header.body.end as u64 * 8,
            inherited: self.blockinfo.get(&header.id).map_or(0, Vec::len),
            local: Vec::new(),
        });
        Ok(())
    }

    fn read_block_header(&mut self, start: u64) -> Result<Item, BitcodeError> {
        let id = self.reader.read_vbr(8)?;
        let width = self.reader.read_vbr(4)?;
        if !(1..=32).contains(&width) {
            return Err(unsupported(
                start,
                format!("block {id} with abbreviation IDs {width} bits wide"),
            ));
        }
        self.reader.align32()?;
        let len_word_at = (self.reader.pos() / 8) as usize;
        let words = self.reader.read(32)?;
        let body_start = self.reader.pos();
        let limit = self
            .scopes
            .last()
            .map_or(self.reader.end, |scope| scope.end);
        if words * 32 > limit.saturating_sub(body_start) {
            return Err(malformed(
                start,
                format!("block {id} of {words} words runs past its enclosing block"),
            ));
        }
        let header = BlockHeader {
            id,
            width: width as u32,
            len_word_at,
            body: (body_start / 8) as usize..((body_start + words * 32) / 8) as usize,
        };
        self.pending = Some(header.clone());
        Ok(Item::Block(header))
    }

    fn abbrev(&self, id: u64) -> Option<Abbrev> {
        let scope = self.scopes.last()?;
        let index = usize::try_from(id.checked_sub(FIRST_DEFINED_ABBREV)?).ok()?;
        if index < scope.inherited {
            self.blockinfo.get(&scope.id)?.get(index).cloned()
        } else {
            scope.local.get(index - scope.inherited).cloned()
        }
    }

    fn define(&mut self, at: u64, abbrev: Abbrev) -> Result<(), BitcodeError> {
        match self.scopes.last_mut() {
            Some(scope) if scope.id == BLOCKINFO_BLOCK_ID => {
                let target = self
                    .setbid
                    .ok_or_else(|| malformed(at, "abbreviation in BLOCKINFO before SETBID"))?;
                self.blockinfo.entry(target).or_default().push(abbrev);
            }
            Some(scope) => scope.local.push(abbrev),
            None => return Err(malformed(at, "abbreviation outside every block")),
        }
        Ok(())
    }

    fn after_record(&mut self) -> Result<Item, BitcodeError> {
        if self.block_id() == Some(BLOCKINFO_BLOCK_ID)
            && self.record().code() == BLOCKINFO_CODE_SETBID
        {
            let at = self.reader.pos();
            self.setbid = Some(
                *self
                    .record()
                    .operands()
                    .first()
                    .ok_or_else(|| malformed(at, "SETBID without a block ID"))?,
            );
        }
        Ok(Item::Record)
    }
}

/// What a block body holds, in file order.
pub(crate) enum BodyItem {
    /// An abbreviation definition, copied verbatim when the body is re-emitted.
    Define { bits: Range<u64>, abbrev: Abbrev },
    /// A record, whose fields are this range of [`Body::fields`].
    Record { at: u64, fields: Range<usize> },
}

/// A block body as read, kept to be re-emitted: its items, and the fields of all its records in one
/// buffer instead of an allocation each.
#[derive(Default)]
pub(crate) struct Body {
    pub(crate) items: Vec<BodyItem>,
    pub(crate) fields: Vec<u64>,
}

impl Body {
    /// An empty body with room for what a summary block body of `bytes` bytes holds (lld's
    /// have at most 0.73 fields and 0.13 records a byte), so that reading one does not grow and
    /// copy its buffers again and again.
    pub(crate) fn for_bytes(bytes: usize) -> Body {
        Body {
            items: Vec::with_capacity(bytes / 4),
            fields: Vec::with_capacity(bytes),
        }
    }

    /// Keeps `record`, which starts at bit `at`. Bodies that are re-emitted have no blobs.
    pub(crate) fn push_record(&mut self, at: u64, record: Record<'_>) -> Result<(), BitcodeError> {
        if record.blob.is_some() {
            return Err(unsupported(
                at,
                format!("a blob in a record of code {}", record.code()),
            ));
        }
        let start = self.fields.len();
        self.fields.extend_from_slice(record.fields);
        self.items.push(BodyItem::Record {
            at,
            fields: start..self.fields.len(),
        });
        Ok(())
    }

    /// The record of this body whose fields are `range` (a [`BodyItem::Record`]'s).
    pub(crate) fn record(&self, range: &Range<usize>) -> Record<'_> {
        Record {
            fields: &self.fields[range.clone()],
            blob: None,
        }
    }
}

/// What a re-emitted block body is made of, in order.
pub(crate) enum Emit<'a> {
    /// An abbreviation definition of the original body, copied.
    Define(&'a Range<u64>, &'a Abbrev),
    /// A record of the original body (its code, then its operands), written with the smallest
    /// abbreviation in scope that fits it.
    Record(&'a [u64]),
    /// A record as `Record`, whose fields are this range of the buffer the emits come with (one
    /// buffer for every rewritten record, not an allocation each).
    Buffered(Range<usize>),
}

#[cfg(test)]
mod tests {
    use super::*;

    impl BitWriter {
        /// The bytes written so far, the last one only if it is whole: to patch, or to read back.
        fn whole_bytes(&mut self) -> &mut Vec<u8> {
            let whole = self.pending_bits / 8;
            let pending = self.pending.to_le_bytes();
            self.bytes.extend_from_slice(&pending[..whole as usize]);
            self.pending = self.pending.checked_shr(whole * 8).unwrap_or(0);
            self.pending_bits -= whole * 8;
            &mut self.bytes
        }
    }

    /// Writes an ENTER_SUBBLOCK in a block with `outer`-bit abbreviation IDs; returns the length word's offset.
    fn enter(w: &mut BitWriter, outer: u32, id: u64, width: u32) -> usize {
        w.write(ENTER_SUBBLOCK, outer);
        w.write_vbr(id, 8);
        w.write_vbr(u64::from(width), 4);
        w.align32();
        let len_at = w.whole_bytes().len();
        w.write(0, 32);
        len_at
    }

    fn end(w: &mut BitWriter, width: u32, len_at: usize) {
        write_end_block(w, width);
        let bytes = w.whole_bytes();
        let words = ((bytes.len() - len_at - 4) / 4) as u32;
        bytes[len_at..len_at + 4].copy_from_slice(&words.to_le_bytes());
    }

    fn define(w: &mut BitWriter, width: u32, ops: &[Op]) {
        w.write(DEFINE_ABBREV, width);
        w.write_vbr(ops.len() as u64, 5);
        for op in ops {
            match *op {
                Op::Literal(value) => {
                    w.write(1, 1);
                    w.write_vbr(value, 8);
                }
                Op::Fixed(width) | Op::Vbr(width) => {
                    w.write(0, 1);
                    w.write(if matches!(op, Op::Fixed(_)) { 1 } else { 2 }, 3);
                    w.write_vbr(u64::from(width), 5);
                }
                Op::Array => w.write(3 << 1, 4),
                Op::Char6 => w.write(4 << 1, 4),
                Op::Blob => w.write(5 << 1, 4),
            }
        }
    }

    /// A record as [`Cursor::record`] reads it, owned.
    #[derive(Debug, PartialEq)]
    struct Owned {
        fields: Vec<u64>,
        blob: Option<Vec<u8>>,
    }

    fn record(fields: &[u64], blob: Option<&[u8]>) -> Owned {
        Owned {
            fields: fields.to_vec(),
            blob: blob.map(<[u8]>::to_vec),
        }
    }

    /// Every item of a stream, entering every block, and its records.
    fn walk(bytes: &[u8]) -> Result<(Vec<Item>, Vec<Owned>), BitcodeError> {
        let mut cursor = Cursor::new(bytes, 0..bytes.len());
        let (mut items, mut records) = (Vec::new(), Vec::new());
        while let Some((_, item)) = cursor.next()? {
            match item {
                Item::Block(_) => cursor.enter()?,
                Item::Record => {
                    let read = cursor.record();
                    records.push(record(read.fields, read.blob));
                }
                Item::End | Item::DefineAbbrev(_) => {}
            }
            items.push(item);
        }
        Ok((items, records))
    }

    const NAME: [Op; 4] = [Op::Literal(7), Op::Vbr(4), Op::Array, Op::Char6];
    const PAIR: [Op; 3] = [Op::Fixed(3), Op::Fixed(64), Op::Vbr(6)];
    const BYTES: [Op; 3] = [Op::Literal(9), Op::Array, Op::Fixed(8)];
    const BLOB: [Op; 2] = [Op::Literal(4), Op::Blob];

    fn abbrevs(list: &[&[Op]]) -> Vec<Abbrev> {
        list.iter().map(|&ops| ops.into()).collect()
    }

    /// Records for block 9 of `sample`, each fitting one of its abbreviations.
    const SAMPLE_RECORDS: [(&[u64], Option<&[u8]>); 6] = [
        (
            &[
                7,
                1 << 40,
                b'a' as u64,
                b'Z' as u64,
                b'0' as u64,
                b'.' as u64,
                b'_' as u64,
            ],
            None,
        ),
        (&[7, 0], None),
        (&[5, u64::MAX, 123_456_789_012], None),
        (&[9, 0, 127, 128, 255], None),
        (&[4], Some(b"hello, blob")),
        (&[4], Some(b"")),
    ];

    /// A module-like block with a BLOCKINFO giving block 9 an abbreviation, and a block 9 that defines more.
    fn sample() -> Vec<u8> {
        let mut w = BitWriter::default();
        let outer = enter(&mut w, TOP_LEVEL_ABBREV_WIDTH, 8, 3);
        write_record(&mut w, &InScope::new(3, &[]), &[1, 2], None).unwrap();
        let info = enter(&mut w, 3, BLOCKINFO_BLOCK_ID, 2);
        write_record(
            &mut w,
            &InScope::new(2, &[]),
            &[BLOCKINFO_CODE_SETBID, 9],
            None,
        )
        .unwrap();
        define(&mut w, 2, &NAME);
        end(&mut w, 2, info);
        let inner = enter(&mut w, 3, 9, 4);
        define(&mut w, 4, &PAIR);
        define(&mut w, 4, &BYTES);
        define(&mut w, 4, &BLOB);
        let in_scope = abbrevs(&[&NAME, &PAIR, &BYTES, &BLOB]);
        for (fields, blob) in SAMPLE_RECORDS {
            let before = w.bits;
            write_record(&mut w, &InScope::new(4, &in_scope), fields, blob).unwrap();
            // Abbreviated: an unabbreviated record would start with ID 3.
            let mut bytes = w.whole_bytes().clone();
            bytes.extend_from_slice(&w.pending.to_le_bytes());
            assert_ne!(
                BitReader::new(&bytes, 0..bytes.len()).tap_read(before, 4),
                UNABBREV_RECORD
            );
        }
        end(&mut w, 4, inner);
        end(&mut w, 3, outer);
        w.into_bytes()
    }

    #[test]
    fn char6_codes_are_positions_in_the_table() {
        for value in 0..300u64 {
            let position = CHAR6.iter().position(|&c| u64::from(c) == value);
            assert_eq!(char6_code(value), position.map(|i| i as u64), "{value}");
        }
    }

    /// Bit by bit, the plainest way: what the word-at-a-time reader and writer must agree with.
    fn bits_of(fields: &[(u64, u32)]) -> Vec<bool> {
        fields
            .iter()
            .flat_map(|&(value, width)| (0..width).map(move |i| value >> i & 1 == 1))
            .collect()
    }

    proptest::proptest! {
        #[test]
        fn words_are_written_and_read_as_their_bits(
            fields in proptest::collection::vec((proptest::num::u64::ANY, 0u32..=64), 0..40),
        ) {
            let mut w = BitWriter::default();
            for &(value, width) in &fields {
                w.write(value, width);
            }
            let want = bits_of(&fields);
            proptest::prop_assert_eq!(w.bits, want.len() as u64);
            let bytes = w.into_bytes();
            let got: Vec<bool> = (0..want.len()).map(|i| bytes[i / 8] >> (i % 8) & 1 == 1).collect();
            proptest::prop_assert_eq!(&got, &want);
            // Bits past the end are zero.
            proptest::prop_assert_eq!(bytes.len(), want.len().div_ceil(8));
            let mut r = BitReader::new(&bytes, 0..bytes.len());
            for &(value, width) in &fields {
                proptest::prop_assert_eq!(r.read(width).unwrap(), value & low_bits(width));
            }
        }

        #[test]
        fn the_size_of_a_record_is_what_writing_it_takes(
            values in proptest::collection::vec(proptest::num::u64::ANY, 1..12),
            shifts in proptest::collection::vec(0u32..64, 12),
            blob in proptest::option::of(proptest::collection::vec(proptest::num::u8::ANY, 0..9)),
            width in 2u32..8,
        ) {
            let fields: Vec<u64> = values.iter().zip(&shifts).map(|(v, s)| v >> s).collect();
            let vbr = [Op::Vbr(6), Op::Array, Op::Vbr(3)];
            let fixed = [Op::Literal(fields[0]), Op::Array, Op::Fixed(64)];
            let blob_ops = [Op::Vbr(5), Op::Blob];
            for ops in [&vbr[..], &fixed, &blob_ops] {
                let fields = if ops == blob_ops { &fields[..1] } else { &fields[..] };
                let Some(bits) = abbreviated_size(width, ops, fields, blob.as_deref()) else {
                    continue;
                };
                let mut w = BitWriter::default();
                write_abbreviated(&mut w, width, 1, ops, fields, blob.as_deref());
                proptest::prop_assert_eq!(w.bits, bits);
            }
        }
    }

    impl BitReader<'_> {
        fn tap_read(mut self, at: u64, width: u32) -> u64 {
            self.seek(at);
            self.read(width).unwrap()
        }
    }

    #[test]
    fn round_trips_every_operand_kind_and_blockinfo() {
        let bytes = sample();
        let (items, records) = walk(&bytes).unwrap();
        assert_eq!(
            items[0],
            Item::Block(BlockHeader {
                id: 8,
                width: 3,
                len_word_at: 4,
                body: 8..bytes.len()
            })
        );
        let mut want = vec![
            record(&[1, 2], None),
            record(&[BLOCKINFO_CODE_SETBID, 9], None),
        ];
        want.extend(
            SAMPLE_RECORDS
                .iter()
                .map(|&(fields, blob)| record(fields, blob)),
        );
        assert_eq!(records, want);
        let defined: Vec<&Item> = items
            .iter()
            .filter(|item| matches!(item, Item::DefineAbbrev(_)))
            .collect();
        assert_eq!(defined.len(), 4);
        assert_eq!(items.iter().filter(|item| **item == Item::End).count(), 3);
    }

    #[test]
    fn the_smallest_fitting_abbreviation_is_chosen() {
        let chars = |bits| [Op::Literal(1), Op::Array, bits];
        let in_scope = abbrevs(&[
            &chars(Op::Fixed(8)),
            &chars(Op::Fixed(7)),
            &chars(Op::Char6),
        ]);
        for (text, id) in [("abc", 6), ("a/b", 5), ("\u{e9}", 4), ("", 6)] {
            let mut fields = vec![1];
            fields.extend(text.bytes().map(u64::from));
            let mut w = BitWriter::default();
            write_record(&mut w, &InScope::new(3, &in_scope), &fields, None).unwrap();
            let bytes = w.into_bytes();
            assert_eq!(
                BitReader::new(&bytes, 0..bytes.len()).tap_read(0, 3),
                id,
                "{text}"
            );
        }
    }

    #[test]
    fn records_that_fit_no_abbreviation_are_written_unabbreviated() {
        let unabbreviated = |fields: &[u64]| {
            let mut w = BitWriter::default();
            write_record(&mut w, &InScope::new(3, &[]), fields, None).unwrap();
            w.into_bytes()
        };
        // '/' is not a char6 character; 8 is not the literal code 7.
        for fields in [&[7, 1, b'/' as u64][..], &[8, 1]] {
            let mut w = BitWriter::default();
            write_record(&mut w, &InScope::new(3, &abbrevs(&[&NAME])), fields, None).unwrap();
            assert_eq!(w.into_bytes(), unabbreviated(fields));
        }
        // IDs beyond the block's abbreviation width cannot be used.
        let mut w = BitWriter::default();
        write_record(&mut w, &InScope::new(2, &abbrevs(&[&NAME])), &[7, 1], None).unwrap();
        assert_eq!(w.bits, 2 + 6 * 3);
        let mut w = BitWriter::default();
        let err = write_record(&mut w, &InScope::new(3, &[]), &[4], Some(b"x")).unwrap_err();
        assert!(matches!(err, BitcodeError::Unsupported { .. }), "{err}");
    }

    #[test]
    fn a_blob_in_a_body_kept_for_re_emitting_is_unsupported() {
        let mut body = Body::default();
        let plain = Record {
            fields: &[7, 1],
            blob: None,
        };
        body.push_record(0, plain).unwrap();
        let with_blob = Record {
            fields: &[4],
            blob: Some(b"x"),
        };
        let err = body.push_record(64, with_blob).unwrap_err();
        assert!(
            matches!(err, BitcodeError::Unsupported { at: 64, .. }),
            "{err}"
        );
        assert_eq!(body.items.len(), 1);
    }

    #[test]
    fn skipped_blocks_are_not_read() {
        let bytes = sample();
        let mut cursor = Cursor::new(&bytes, 0..bytes.len());
        let mut ids = Vec::new();
        while let Some((_, item)) = cursor.next().unwrap() {
            if let Item::Block(header) = item {
                ids.push(header.id);
                if header.id == 8 {
                    cursor.enter().unwrap();
                }
            }
        }
        // Block 9 uses BLOCKINFO's abbreviation; skipping BLOCKINFO and block 9 still walks the stream.
        assert_eq!(ids, [8, BLOCKINFO_BLOCK_ID, 9]);
    }

    fn error(bytes: &[u8]) -> BitcodeError {
        walk(bytes).unwrap_err()
    }

    #[test]
    fn malformed_streams_are_errors_with_their_position() {
        let good = sample();
        for len in (12..good.len()).step_by(4) {
            assert!(matches!(
                error(&good[..len]),
                BitcodeError::Truncated { .. } | BitcodeError::Malformed { .. }
            ));
        }
        // A length word one word short: END_BLOCK is found past the end the word gives.
        let mut short = good.clone();
        short[4] -= 1;
        assert!(matches!(error(&short), BitcodeError::Malformed { .. }));

        let mut w = BitWriter::default();
        let outer = enter(&mut w, TOP_LEVEL_ABBREV_WIDTH, 8, 3);
        w.write(4, 3);
        end(&mut w, 3, outer);
        assert_eq!(
            error(&w.into_bytes()),
            malformed(64, "undefined abbreviation ID 4")
        );

        let mut w = BitWriter::default();
        let outer = enter(&mut w, TOP_LEVEL_ABBREV_WIDTH, 8, 6);
        w.write(UNABBREV_RECORD, 6);
        w.write_vbr(1, 6);
        w.write_vbr(1, 6);
        for _ in 0..13 {
            w.write(0x3f, 6);
        }
        w.write(1, 6);
        end(&mut w, 6, outer);
        assert_eq!(
            error(&w.into_bytes()),
            malformed(82, "VBR value does not fit in 64 bits")
        );

        let mut w = BitWriter::default();
        let outer = enter(&mut w, TOP_LEVEL_ABBREV_WIDTH, 8, 3);
        define(&mut w, 3, &[Op::Array, Op::Fixed(8)]);
        end(&mut w, 3, outer);
        assert!(matches!(
            error(&w.into_bytes()),
            BitcodeError::Malformed { at: 67, .. }
        ));

        // A record outside every block.
        assert_eq!(
            error(&[3; 16]),
            malformed(0, "abbreviation ID 3 outside every block")
        );
    }

    #[test]
    fn huge_counts_fail_before_allocating() {
        let mut w = BitWriter::default();
        let outer = enter(&mut w, TOP_LEVEL_ABBREV_WIDTH, 8, 3);
        w.write(UNABBREV_RECORD, 3);
        w.write_vbr(1, 6);
        w.write_vbr(u64::MAX, 6);
        end(&mut w, 3, outer);
        assert!(matches!(
            error(&w.into_bytes()),
            BitcodeError::Truncated { .. }
        ));
    }

    #[test]
    fn nesting_is_bounded() {
        let mut w = BitWriter::default();
        let mut lens = vec![enter(&mut w, TOP_LEVEL_ABBREV_WIDTH, 8, 2)];
        for _ in 0..MAX_DEPTH {
            lens.push(enter(&mut w, 2, 8, 2));
        }
        while let Some(len_at) = lens.pop() {
            end(&mut w, 2, len_at);
        }
        assert!(matches!(
            error(&w.into_bytes()),
            BitcodeError::Unsupported { .. }
        ));
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config { failure_persistence: None, ..Default::default() })]

        #[test]
        fn any_record_round_trips(code in 0u64..100, fields in proptest::collection::vec(proptest::num::u64::ANY, 0..20),
                                  width in 3u32..8, use_abbrev: bool) {
            let mut all = vec![code];
            all.extend(fields.iter().map(|f| f >> (f % 64)));
            let ops = [Op::Vbr(6), Op::Array, Op::Vbr(7)];
            let in_scope = if use_abbrev { abbrevs(&[&ops]) } else { Vec::new() };
            let mut w = BitWriter::default();
            let outer = enter(&mut w, TOP_LEVEL_ABBREV_WIDTH, 8, width);
            define(&mut w, width, &ops);
            write_record(&mut w, &InScope::new(width, &in_scope), &all, None).unwrap();
            end(&mut w, width, outer);
            let (_, records) = walk(&w.into_bytes()).unwrap();
            proptest::prop_assert_eq!(records, vec![record(&all, None)]);
        }

        #[test]
        fn packed_arrays_are_the_bits_of_one_write_per_element_and_read_back(
            raw in proptest::collection::vec(proptest::num::u64::ANY, 0..100),
            width in 1u32..=32, char6: bool, offset in 0u32..64,
        ) {
            let element = if char6 { Op::Char6 } else { Op::Fixed(width) };
            let values: Vec<u64> = raw
                .iter()
                .map(|&v| if char6 { u64::from(CHAR6[(v % 64) as usize]) } else { v & low_bits(width) })
                .collect();
            let mut packed = BitWriter::default();
            packed.write(0, offset);
            write_array(&mut packed, element, &values);
            let mut one_by_one = BitWriter::default();
            one_by_one.write(0, offset);
            for &value in &values {
                write_scalar(&mut one_by_one, element, value);
            }
            proptest::prop_assert_eq!(packed.bits, one_by_one.bits);
            let bytes = one_by_one.into_bytes();
            proptest::prop_assert_eq!(&packed.into_bytes(), &bytes);
            // Read back, packed too, from the same offset.
            let mut r = BitReader::new(&bytes, 0..bytes.len());
            r.seek(u64::from(offset));
            let mut read = Vec::new();
            match element {
                Op::Char6 => read_packed(&mut r, 6, values.len() as u64, &mut read, |code| {
                    u64::from(CHAR6[code as usize])
                }),
                _ => read_packed(&mut r, width, values.len() as u64, &mut read, |code| code),
            }
            proptest::prop_assert_eq!(read, values);
        }
    }
}
