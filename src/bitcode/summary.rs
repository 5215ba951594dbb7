//! The combined summary block (GLOBALVAL_SUMMARY) of an index shard, rewritten so that it no longer
//! depends on the order of the modules' original paths.
//!
//! lld's writer (`IndexBitcodeWriter`) visits the shard's modules in the sorted order of their paths,
//! and that order leaks into the block three ways: each summary record names its module by ID; value
//! IDs (FS_VALUE_GUID maps each to a GUID, every other record refers to values by these IDs) are handed
//! out in that visiting order; and the summary records come in that order. So, given the new module
//! IDs, [`canonical`] remaps every module ID, renumbers the values 1.. in GUID order (a GUID is a hash
//! of the symbol's name, so content), and sorts the summaries by (alias or not, new module ID, GUID),
//! keeping aliases after everything else as the reader requires. A summary moves together with the
//! type-test records before it, which the reader attaches to the next function summary, and with an
//! ORIGINAL_NAME after it. Records that do not depend on module order (version, flags, CFI names,
//! type IDs, block count) keep their places.
//!
//! Only LLVM's summary versions 7 to 13 are accepted, whose record layouts are known. MemProf records
//! (stack IDs, callsite and allocation info, the context radix tree) are ordered and indexed by module
//! order in ways not undone here, so they, like any record code not listed, make the shard
//! [`BitcodeError::Unsupported`].

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::ops::Range;

use super::bitstream::{Body, BodyItem, Emit, Record, malformed, unsupported};
use super::error::BitcodeError;

const FS_COMBINED: u64 = 4;
const FS_COMBINED_PROFILE: u64 = 5;
const FS_COMBINED_GLOBALVAR_INIT_REFS: u64 = 6;
const FS_COMBINED_ALIAS: u64 = 8;
const FS_COMBINED_ORIGINAL_NAME: u64 = 9;
const FS_VERSION: u64 = 10;
const FS_TYPE_TESTS: u64 = 11;
const FS_TYPE_TEST_ASSUME_VCALLS: u64 = 12;
const FS_TYPE_CHECKED_LOAD_VCALLS: u64 = 13;
const FS_TYPE_TEST_ASSUME_CONST_VCALL: u64 = 14;
const FS_TYPE_CHECKED_LOAD_CONST_VCALL: u64 = 15;
const FS_VALUE_GUID: u64 = 16;
const FS_CFI_FUNCTION_DEFS: u64 = 17;
const FS_CFI_FUNCTION_DECLS: u64 = 18;
const FS_FLAGS: u64 = 20;
const FS_TYPE_ID: u64 = 21;
const FS_BLOCK_COUNT: u64 = 24;
const FS_PARAM_ACCESS: u64 = 25;

/// Summary versions whose combined records have the layout handled here (7 put the write-only
/// reference count at its place; 11 split FS_VALUE_GUID's GUID into two 32-bit halves).
const VERSIONS: std::ops::RangeInclusive<u64> = 7..=13;
const SPLIT_GUID_VERSION: u64 = 11;

/// Operands of FS_COMBINED and FS_COMBINED_PROFILE before the references: valueid, modid, flags,
/// instcount, fflags, entrycount, numrefs, rorefcnt, worefcnt.
const FUNCTION_FIXED: usize = 9;
const FUNCTION_NUMREFS: usize = 6;
/// Operands of FS_COMBINED_GLOBALVAR_INIT_REFS before the references: valueid, modid, flags, varflags.
const VARIABLE_FIXED: usize = 4;

/// How a record code takes part in the rewrite.
enum Role {
    /// Independent of module order; keeps its place.
    Fixed,
    /// FS_VALUE_GUID: renumbered and sorted.
    ValueGuid,
    /// Read by LLVM as belonging to the next function summary.
    Attached,
    /// A summary record; the flag says whether it is an alias.
    Summary(bool),
    /// Belongs to the summary record right before it.
    OriginalName,
}

fn role(code: u64) -> Option<Role> {
    Some(match code {
        FS_VERSION
        | FS_FLAGS
        | FS_CFI_FUNCTION_DEFS
        | FS_CFI_FUNCTION_DECLS
        | FS_TYPE_ID
        | FS_BLOCK_COUNT => Role::Fixed,
        FS_VALUE_GUID => Role::ValueGuid,
        FS_TYPE_TESTS
        | FS_TYPE_TEST_ASSUME_VCALLS
        | FS_TYPE_CHECKED_LOAD_VCALLS
        | FS_TYPE_TEST_ASSUME_CONST_VCALL
        | FS_TYPE_CHECKED_LOAD_CONST_VCALL
        | FS_PARAM_ACCESS => Role::Attached,
        FS_COMBINED | FS_COMBINED_PROFILE | FS_COMBINED_GLOBALVAR_INIT_REFS => Role::Summary(false),
        FS_COMBINED_ALIAS => Role::Summary(true),
        FS_COMBINED_ORIGINAL_NAME => Role::OriginalName,
        _ => return None,
    })
}

/// A map from a shard's IDs (of values or modules) to numbers. LLVM hands both kinds out densely
/// from 0 or 1, so they index a table, which a rewrite looks up several times per record; an ID far
/// beyond their count (a malformed shard) goes to a hash map instead.
pub(crate) struct IdMap {
    dense: Vec<Option<u64>>,
    /// IDs from this on are in `sparse`.
    dense_limit: u64,
    sparse: HashMap<u64, u64>,
}

impl IdMap {
    /// A map of about `count` IDs.
    pub(crate) fn with_capacity(count: usize) -> IdMap {
        IdMap {
            dense: Vec::with_capacity(count + 1),
            dense_limit: 2 * count as u64 + 64,
            sparse: HashMap::new(),
        }
    }

    /// Maps `id` to `to`; false if it was mapped already (and it stays as it was).
    pub(crate) fn insert(&mut self, id: u64, to: u64) -> bool {
        if id >= self.dense_limit {
            return match self.sparse.entry(id) {
                Entry::Occupied(_) => false,
                Entry::Vacant(slot) => {
                    slot.insert(to);
                    true
                }
            };
        }
        let at = id as usize;
        if self.dense.len() <= at {
            self.dense.resize(at + 1, None);
        }
        let slot = &mut self.dense[at];
        if slot.is_some() {
            return false;
        }
        *slot = Some(to);
        true
    }

    pub(crate) fn get(&self, id: u64) -> Option<u64> {
        if id >= self.dense_limit {
            return self.sparse.get(&id).copied();
        }
        self.dense.get(id as usize).copied().flatten()
    }
}

/// Old → new value IDs, and each old ID's GUID.
struct Values {
    new_id: IdMap,
    guid: IdMap,
    /// The GUIDs in their order, which is that of the new IDs (from 1).
    guids: Vec<u64>,
}

fn values(body: &Body, version: u64) -> Result<Values, BitcodeError> {
    let mut pairs = Vec::new();
    for (at, record) in records(body) {
        if record.code() != FS_VALUE_GUID {
            continue;
        }
        let (id, guid) = match (version >= SPLIT_GUID_VERSION, record.operands()) {
            (true, &[id, high, low]) if high >> 32 == 0 && low >> 32 == 0 => (id, high << 32 | low),
            (false, &[id, guid]) => (id, guid),
            _ => return Err(malformed(at, "FS_VALUE_GUID record of the wrong shape")),
        };
        pairs.push((guid, id, at));
    }
    pairs.sort_unstable();
    let mut values = Values {
        new_id: IdMap::with_capacity(pairs.len()),
        guid: IdMap::with_capacity(pairs.len()),
        guids: Vec::with_capacity(pairs.len()),
    };
    if let Some(pair) = pairs.windows(2).find(|pair| pair[0].0 == pair[1].0) {
        return Err(malformed(
            pair[1].2,
            format!("GUID {:#x} has two value IDs", pair[1].0),
        ));
    }
    for (new_id, &(guid, old_id, at)) in (1..).zip(&pairs) {
        if !values.new_id.insert(old_id, new_id) {
            return Err(malformed(at, format!("value ID {old_id} given two GUIDs")));
        }
        values.guid.insert(old_id, guid);
        values.guids.push(guid);
    }
    Ok(values)
}

/// The records of `body`, with where each starts.
fn records(body: &Body) -> impl Iterator<Item = (u64, Record<'_>)> {
    body.items.iter().filter_map(|item| match item {
        BodyItem::Record { at, fields } => Some((*at, body.record(fields))),
        BodyItem::Define { .. } => None,
    })
}

/// Rewrites one record's module and value IDs in place.
struct Remap<'a> {
    at: u64,
    modules: &'a IdMap,
    values: &'a Values,
}

impl Remap<'_> {
    fn value(&self, fields: &mut [u64], i: usize) -> Result<(), BitcodeError> {
        let field = fields
            .get_mut(i)
            .ok_or_else(|| malformed(self.at, "summary record too short"))?;
        *field =
            self.values.new_id.get(*field).ok_or_else(|| {
                malformed(self.at, format!("value ID {field} has no FS_VALUE_GUID"))
            })?;
        Ok(())
    }

    fn values(
        &self,
        fields: &mut [u64],
        mut indices: impl Iterator<Item = usize>,
    ) -> Result<(), BitcodeError> {
        indices.try_for_each(|i| self.value(fields, i))
    }

    fn module(&self, fields: &mut [u64], i: usize) -> Result<(), BitcodeError> {
        let field = fields
            .get_mut(i)
            .ok_or_else(|| malformed(self.at, "summary record too short"))?;
        *field = self.modules.get(*field).ok_or_else(|| {
            malformed(
                self.at,
                format!("module ID {field} is not in MODULE_STRTAB"),
            )
        })?;
        Ok(())
    }

    /// The record `fields` appended to `buffer` with its IDs rewritten: where it is there.
    fn buffered(
        &self,
        fields: &[u64],
        buffer: &mut Vec<u64>,
    ) -> Result<Range<usize>, BitcodeError> {
        let start = buffer.len();
        buffer.extend_from_slice(fields);
        self.record(&mut buffer[start..])?;
        Ok(start..buffer.len())
    }

    /// Rewrites the IDs of a record; `fields[0]` is the code, so operand `i` is `fields[i + 1]`.
    fn record(&self, fields: &mut [u64]) -> Result<(), BitcodeError> {
        let ops = fields.len().saturating_sub(1);
        let code = fields.first().copied().unwrap_or_default();
        match code {
            FS_COMBINED | FS_COMBINED_PROFILE => {
                let numrefs = fields
                    .get(1 + FUNCTION_NUMREFS)
                    .copied()
                    .unwrap_or(u64::MAX);
                let calls_at = usize::try_from(numrefs)
                    .ok()
                    .and_then(|n| n.checked_add(FUNCTION_FIXED))
                    .filter(|&start| start <= ops)
                    .ok_or_else(|| {
                        malformed(self.at, "function summary shorter than its references")
                    })?;
                // With a profile, each call is a (callee, hotness) pair.
                let step = if code == FS_COMBINED_PROFILE { 2 } else { 1 };
                if !(ops - calls_at).is_multiple_of(step) {
                    return Err(malformed(self.at, "function summary with half a call edge"));
                }
                self.module(fields, 2)?;
                self.values(fields, std::iter::once(1))?;
                self.values(
                    fields,
                    (FUNCTION_FIXED + 1..calls_at + 1).chain((calls_at + 1..=ops).step_by(step)),
                )?;
            }
            FS_COMBINED_GLOBALVAR_INIT_REFS => {
                if ops < VARIABLE_FIXED {
                    return Err(malformed(self.at, "variable summary too short"));
                }
                self.module(fields, 2)?;
                self.values(fields, std::iter::once(1).chain(VARIABLE_FIXED + 1..=ops))?;
            }
            FS_COMBINED_ALIAS => {
                if ops != 4 {
                    return Err(malformed(self.at, "alias summary not of four operands"));
                }
                self.module(fields, 2)?;
                self.value(fields, 1)?;
                // 0: the aliasee's summary is not in the index.
                if fields[4] != 0 {
                    self.value(fields, 4)?;
                }
            }
            FS_PARAM_ACCESS => self.param_access(fields)?,
            _ => {}
        }
        Ok(())
    }

    /// `n x (paramno, lower, upper, numcalls, numcalls x (paramno, callee, lower, upper))`.
    fn param_access(&self, fields: &mut [u64]) -> Result<(), BitcodeError> {
        let mut i = 1;
        while i < fields.len() {
            let calls = fields
                .get(i + 3)
                .ok_or_else(|| malformed(self.at, "FS_PARAM_ACCESS cut short"))?;
            let calls = usize::try_from(*calls)
                .ok()
                .filter(|&n| n <= fields.len())
                .ok_or_else(|| malformed(self.at, "FS_PARAM_ACCESS with too many calls"))?;
            i += 4;
            for _ in 0..calls {
                self.value(fields, i + 1)?;
                i += 4;
            }
            if i > fields.len() {
                return Err(malformed(self.at, "FS_PARAM_ACCESS cut short"));
            }
        }
        Ok(())
    }
}

/// A summary record with what travels with it (a range of the emits grouped so far), and where it
/// sorts.
struct Group {
    key: (bool, u64, u64),
    emits: Range<usize>,
}

/// Where an item that keeps its place goes: before the summaries if none came yet, else after them.
fn before_or_after<'v, T>(
    groups: &[Group],
    head: &'v mut Vec<T>,
    tail: &'v mut Vec<T>,
) -> &'v mut Vec<T> {
    if groups.is_empty() { head } else { tail }
}

/// The summary block's body, as abbreviation definitions and records, with module IDs mapped by
/// `modules` (old → new) and the values and summaries renumbered and ordered as the module doc says;
/// and the buffer that holds the fields of the rewritten records ([`Emit::Buffered`]).
pub(crate) fn canonical<'a>(
    body: &'a Body,
    modules: &IdMap,
) -> Result<(Vec<Emit<'a>>, Vec<u64>), BitcodeError> {
    let version = match records(body).next() {
        Some((at, record)) if record.code() == FS_VERSION => {
            let version = record.operands().first().copied().unwrap_or_default();
            if !VERSIONS.contains(&version) {
                return Err(unsupported(at, format!("summary version {version}")));
            }
            version
        }
        _ => return Err(malformed(0, "summary block without FS_VERSION first")),
    };
    let values = values(body, version)?;
    let items = &body.items;

    let mut head: Vec<Emit<'a>> = Vec::new();
    let mut groups: Vec<Group> = Vec::new();
    let mut grouped: Vec<Emit<'a>> = Vec::with_capacity(items.len());
    let mut tail: Vec<Emit<'a>> = Vec::new();
    let mut pending: Vec<Emit<'a>> = Vec::new();
    // Rewritten records are at most all of them: sized once, not grown record by record.
    let mut buffer: Vec<u64> = Vec::with_capacity(body.fields.len());
    let mut table_written = false;
    // Whether the last record was a summary, which an ORIGINAL_NAME may follow.
    let mut after_summary = false;
    for item in items {
        let (at, record) = match item {
            BodyItem::Define { bits, abbrev } => {
                if !pending.is_empty() {
                    return Err(unsupported(
                        bits.start,
                        "abbreviation defined between a summary's records",
                    ));
                }
                before_or_after(&groups, &mut head, &mut tail).push(Emit::Define(bits, abbrev));
                after_summary = false;
                continue;
            }
            BodyItem::Record { at, fields } => (*at, body.record(fields)),
        };
        let role = role(record.code())
            .ok_or_else(|| unsupported(at, format!("summary record of code {}", record.code())))?;
        let remap = Remap {
            at,
            modules,
            values: &values,
        };
        let following_summary = std::mem::replace(&mut after_summary, false);
        let misplaced = || {
            unsupported(
                at,
                format!(
                    "summary record of code {} out of LLVM's order",
                    record.code()
                ),
            )
        };
        match role {
            Role::Fixed | Role::ValueGuid if !pending.is_empty() => return Err(misplaced()),
            Role::Fixed => {
                before_or_after(&groups, &mut head, &mut tail).push(Emit::Record(record.fields));
            }
            Role::ValueGuid if !groups.is_empty() => return Err(misplaced()),
            Role::ValueGuid => {
                if !std::mem::replace(&mut table_written, true) {
                    for (new_id, &guid) in (1..).zip(&values.guids) {
                        let start = buffer.len();
                        if version >= SPLIT_GUID_VERSION {
                            buffer.extend([FS_VALUE_GUID, new_id, guid >> 32, guid & 0xFFFF_FFFF]);
                        } else {
                            buffer.extend([FS_VALUE_GUID, new_id, guid]);
                        }
                        head.push(Emit::Buffered(start..buffer.len()));
                    }
                }
            }
            Role::Attached | Role::Summary(_) if !tail.is_empty() => return Err(misplaced()),
            Role::Attached => {
                let fields = remap.buffered(record.fields, &mut buffer)?;
                pending.push(Emit::Buffered(fields));
            }
            Role::Summary(alias) => {
                let fields = remap.buffered(record.fields, &mut buffer)?;
                let old_value = record.operands().first().copied().unwrap_or_default();
                let guid = values.guid.get(old_value).unwrap_or_default();
                let module = buffer[fields.clone()].get(2).copied().unwrap_or_default();
                let start = grouped.len();
                grouped.append(&mut pending);
                grouped.push(Emit::Buffered(fields));
                groups.push(Group {
                    key: (alias, module, guid),
                    emits: start..grouped.len(),
                });
                after_summary = true;
            }
            Role::OriginalName => match groups.last_mut() {
                Some(group) if following_summary => {
                    grouped.push(Emit::Record(record.fields));
                    group.emits.end = grouped.len();
                }
                _ => {
                    return Err(malformed(
                        at,
                        "FS_COMBINED_ORIGINAL_NAME that follows no summary",
                    ));
                }
            },
        }
    }
    if !pending.is_empty() {
        return Err(malformed(
            0,
            "type information that no function summary follows",
        ));
    }
    groups.sort_by_key(|group| group.key);
    head.reserve(grouped.len() + tail.len());
    for group in groups {
        // Each emit is taken once: the groups' ranges do not overlap.
        let taken = grouped[group.emits].iter_mut();
        head.extend(taken.map(|emit| std::mem::replace(emit, Emit::Record(&[]))));
    }
    head.extend(tail);
    Ok((head, buffer))
}

#[cfg(test)]
mod tests {
    use super::IdMap;

    #[test]
    fn ids_far_beyond_the_count_are_mapped_too() {
        let mut map = IdMap::with_capacity(3);
        for (id, to) in [(1, 10), (0, 11), (u64::MAX, 12), (1_000_000, 13)] {
            assert!(map.insert(id, to), "{id}");
        }
        // A second mapping of an ID is refused and leaves the first.
        assert!(!map.insert(1, 20));
        assert!(!map.insert(u64::MAX, 21));
        let got: Vec<_> = [0, 1, 2, u64::MAX, 1_000_000, 999_999]
            .map(|id| map.get(id))
            .into();
        assert_eq!(got, [Some(11), Some(10), None, Some(12), Some(13), None]);
    }
}
