//! A reader and writer for the LLVM bitstream container, enough to read and rewrite the module paths of
//! ThinLTO index shards and to read a module's hash, in pure Rust.
//!
//! lld writes, for each ThinLTO backend job, an index shard (`*.native.o.thinlto.bc`) whose
//! MODULE_STRTAB block records the path and hash of the job's module and of each module it imports from;
//! the backend compile opens the imported modules by those paths. [`canonicalize_shard`] lets a
//! distributor give the modules canonical names and makes the shard depend on those names only (so that
//! actions are cacheable and relocatable), and [`module_hash`] matches each shard entry to an input file
//! by content.
//!
//! Every function accepts any bytes: malformed input gives a [`BitcodeError`] saying what is wrong and at
//! which bit, never a panic, and the work is bounded by the input's length.
//!
//! Layout: `error` ([`BitcodeError`]), `bitstream` (bits, abbreviations, BLOCKINFO, the block walk), `container` (raw, wrapped or
//! ELF-embedded bitcode), `shard` (MODULE_STRTAB read and rewrite), `summary` (the summary block's module
//! and value IDs and record order), `module` (a module's hash).

mod bitstream;
mod container;
mod error;
mod module;
mod shard;
mod summary;

pub use error::BitcodeError;
pub use shard::ModuleEntry;

/// Module paths (and hashes) recorded in an index shard's MODULE_STRTAB, in file order.
///
/// The shard's own module is among them, with the modules its backend imports from.
pub fn shard_modules(shard: &[u8]) -> Result<Vec<ModuleEntry>, BitcodeError> {
    shard::shard_modules(shard)
}

/// The same shard with each module path replaced by `new_path(entry)`, in a form that depends only on
/// the new paths and the modules' content, not on the original paths.
///
/// `new_path` is called once per entry, in file order. lld numbers a shard's modules in the sorted
/// order of their original paths, and the summary refers to modules by number and lists its records in
/// that order; so the modules are renumbered in the byte order of the new paths, MODULE_STRTAB is
/// re-emitted in that order, and the summary block's module IDs, value IDs and record order are made
/// canonical (see `summary`). Two links of the same objects under other paths, canonicalized with the
/// same new names, give byte-identical shards; a backend compile with the result, given the modules
/// under their new paths, produces the same native object. The new paths must be distinct.
///
/// A shard with records whose dependence on module order is not undone here (MemProf, summary versions
/// other than 7 to 13, per-module summaries) gives [`BitcodeError::Unsupported`].
pub fn canonicalize_shard<P: AsRef<[u8]>>(
    shard: &[u8],
    new_path: impl FnMut(&ModuleEntry) -> P,
) -> Result<Vec<u8>, BitcodeError> {
    shard::canonicalize_shard(shard, new_path)
}

/// An index shard read once, to match its module entries to files and then canonicalize it without
/// reading it again.
pub struct ReadShard<'a> {
    bytes: &'a [u8],
    shard: shard::Shard,
}

impl<'a> ReadShard<'a> {
    /// Reads `shard`; fails where [`canonicalize_shard`] would fail to read it.
    pub fn new(shard: &'a [u8]) -> Result<ReadShard<'a>, BitcodeError> {
        let read = shard::read_for_rewrite(shard)?;
        Ok(ReadShard {
            bytes: shard,
            shard: read,
        })
    }

    /// The modules it records, as [`shard_modules`] gives them.
    pub fn modules(&self) -> &[ModuleEntry] {
        &self.shard.entries
    }

    /// [`canonicalize_shard`] of the shard.
    pub fn canonicalize<P: AsRef<[u8]>>(
        &self,
        new_path: impl FnMut(&ModuleEntry) -> P,
    ) -> Result<Vec<u8>, BitcodeError> {
        shard::canonicalize(self.bytes, &self.shard, new_path)
    }
}

/// The MODULE_CODE_HASH of a module's bitcode (raw, wrapped, or inside an ELF `.llvm.lto` section);
/// `None` if it has none (modules get one when compiled for ThinLTO).
///
/// With several modules in one file (a split LTO unit), the first hash is the one the link uses.
pub fn module_hash(module: &[u8]) -> Result<Option<[u32; 5]>, BitcodeError> {
    module::module_hash(module)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A shard lld 22.1.8 wrote for `t1.o`, which imports from `t2.o` and an archive member.
    const SHARD: &[u8] = include_bytes!("testdata/t1.thinlto.bc");
    /// The bitcode of `t1.o` from the same link.
    const MODULE: &[u8] = include_bytes!("testdata/t1.o");

    /// A shard lld-link 22.1.8 (COFF, `--target=x86_64-pc-windows-msvc`) wrote for `t1.o`, which
    /// imports from `t2.o` and from `t3.o` in `libt3.lib`, and the three modules' bitcode.
    const COFF_SHARD: &[u8] = include_bytes!("testdata/coff-t1.thinlto.bc");
    const COFF_T1: &[u8] = include_bytes!("testdata/coff-t1.o");
    const COFF_T2: &[u8] = include_bytes!("testdata/coff-t2.o");
    const COFF_MEMBER: &[u8] = include_bytes!("testdata/coff-libt3-member.o");

    fn paths(shard: &[u8]) -> Vec<Vec<u8>> {
        shard_modules(shard)
            .unwrap()
            .into_iter()
            .map(|entry| entry.path)
            .collect()
    }

    #[test]
    fn reads_a_real_shard_and_matches_its_module_by_hash() {
        let entries = shard_modules(SHARD).unwrap();
        let names: Vec<&[u8]> = entries.iter().map(|entry| &entry.path[..]).collect();
        assert_eq!(
            names,
            [&b"libt3.a(t3.o at 78).3.1CB1.o"[..], b"t1.o", b"t2.o"]
        );
        assert_eq!(
            entries.iter().map(|entry| entry.id).collect::<Vec<_>>(),
            [0, 1, 2]
        );
        assert!(entries.iter().all(|entry| entry.hash.is_some()));
        assert_eq!(module_hash(MODULE).unwrap(), entries[1].hash);
    }

    #[test]
    fn reads_a_coff_shard_whose_archive_member_has_lld_links_name() {
        // lld-link names an extracted member `<archive file name><member name><offset>.<task>.<PID
        // in hex>.o`: no parentheses, unlike ld.lld's `libt3.a(t3.o at 78)`.
        let entries = shard_modules(COFF_SHARD).unwrap();
        let recorded: Vec<&[u8]> = entries.iter().map(|entry| &entry.path[..]).collect();
        assert_eq!(
            recorded,
            [&b"libt3.libt3.o158.3.453F.o"[..], b"t1.o", b"t2.o"]
        );
        // COFF-target bitcode is raw bitcode, like ELF-target bitcode: the hashes are found.
        for (entry, module) in entries.iter().zip([COFF_MEMBER, COFF_T1, COFF_T2]) {
            let hash = module_hash(module)
                .unwrap()
                .expect("a ThinLTO module has a hash");
            assert!(entry.matches_hash(&hash), "{entry:?}");
        }
        let renamed = canonicalize_shard(COFF_SHARD, names(&["m.o", "z.o", "a.o"])).unwrap();
        assert_eq!(
            paths(&renamed),
            [b"a.o".to_vec(), b"m.o".to_vec(), b"z.o".to_vec()]
        );
    }

    #[test]
    fn hashes_match_despite_llvm_corrupting_the_first_word() {
        let hash = [0x628A_3655, 1, 2, 3, 4];
        let entry = |recorded| ModuleEntry {
            id: 0,
            path: Vec::new(),
            hash: Some(recorded),
        };
        assert!(entry(hash).matches_hash(&hash));
        // Seen with lld 22.1.8 and a module named `α.o`.
        assert!(entry([0x628A_365F, 1, 2, 3, 4]).matches_hash(&hash));
        assert!(!entry([0x628A_3654, 1, 2, 3, 4]).matches_hash(&hash));
        assert!(!entry([0x628A_3655, 1, 2, 3, 5]).matches_hash(&hash));
        assert!(
            !ModuleEntry {
                hash: None,
                ..entry(hash)
            }
            .matches_hash(&hash)
        );
    }

    fn names(names: &[&str]) -> impl FnMut(&ModuleEntry) -> Vec<u8> {
        let names: Vec<Vec<u8>> = names.iter().map(|n| n.as_bytes().to_vec()).collect();
        move |entry| names[entry.id as usize].clone()
    }

    #[test]
    fn canonicalizing_renumbers_the_modules_in_the_order_of_their_new_paths() {
        let before = shard_modules(SHARD).unwrap();
        // libt3.a(...) → m.o, t1.o → z.o, t2.o → a.o: the order becomes t2, libt3, t1.
        let renamed = canonicalize_shard(SHARD, names(&["m.o", "z.o", "a.o"])).unwrap();
        let after = shard_modules(&renamed).unwrap();
        let summary = |entries: &[ModuleEntry]| -> Vec<(u64, Vec<u8>, Option<[u32; 5]>)> {
            entries
                .iter()
                .map(|e| (e.id, e.path.clone(), e.hash))
                .collect()
        };
        assert_eq!(
            summary(&after),
            [
                (0, b"a.o".to_vec(), before[2].hash),
                (1, b"m.o".to_vec(), before[0].hash),
                (2, b"z.o".to_vec(), before[1].hash),
            ]
        );
        // Longer names, and names LLVM would encode as 8-bit characters, read back as given.
        let long = format!("cas/{}.o", "x".repeat(64));
        for name in [long.as_str(), "\u{e9}/\u{1F381}.o"] {
            let rewritten =
                canonicalize_shard(SHARD, |e| format!("{name}{}", e.id).into_bytes()).unwrap();
            let paths: Vec<Vec<u8>> = paths(&rewritten);
            assert_eq!(
                paths,
                (0..3)
                    .map(|id| format!("{name}{id}").into_bytes())
                    .collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn the_result_depends_on_the_new_names_only() {
        let original = paths(SHARD);
        let as_is = canonicalize_shard(SHARD, |e| e.path.clone()).unwrap();
        // Canonical already: canonicalizing again changes nothing.
        assert_eq!(
            canonicalize_shard(&as_is, |e| e.path.clone()).unwrap(),
            as_is
        );
        // A shard whose modules are numbered in another order (as when lld saw other paths), given the
        // same names, comes out the same.
        let reordered = canonicalize_shard(SHARD, names(&["c", "b", "a"])).unwrap();
        assert_ne!(reordered, as_is);
        let back = canonicalize_shard(&reordered, |e| original[2 - e.id as usize].clone()).unwrap();
        assert_eq!(back, as_is);
    }

    #[test]
    fn a_shard_read_once_gives_what_the_functions_give() {
        for shard in [SHARD, COFF_SHARD] {
            let read = ReadShard::new(shard).unwrap();
            assert_eq!(read.modules(), shard_modules(shard).unwrap());
            let rename = |e: &ModuleEntry| format!("renamed-{}.o", 9 - e.id).into_bytes();
            assert_eq!(
                read.canonicalize(rename).unwrap(),
                canonicalize_shard(shard, rename).unwrap()
            );
        }
    }

    #[test]
    fn the_new_names_must_differ() {
        let err = canonicalize_shard(SHARD, |_| b"same.o".to_vec()).unwrap_err();
        assert!(matches!(err, BitcodeError::Unsupported { .. }), "{err}");
    }

    /// The shard behind the wrapper header, with a trailing pad as Darwin writes it.
    fn wrapped(shard: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        for word in [0x0B17_C0DE_u32, 0, 20, shard.len() as u32, 7] {
            out.extend(word.to_le_bytes());
        }
        out.extend(shard);
        out.extend([0; 12]);
        out
    }

    #[test]
    fn wrapped_bitcode_is_read_and_its_size_kept_right() {
        assert_eq!(
            shard_modules(&wrapped(SHARD)).unwrap(),
            shard_modules(SHARD).unwrap()
        );
        assert_eq!(
            module_hash(&wrapped(MODULE)).unwrap(),
            module_hash(MODULE).unwrap()
        );
        let rename = |entry: &ModuleEntry| format!("renamed-module-{}.o", entry.id).into_bytes();
        let renamed = canonicalize_shard(SHARD, rename).unwrap();
        let renamed_wrapped = canonicalize_shard(&wrapped(SHARD), rename);
        assert_eq!(renamed_wrapped.unwrap(), wrapped(&renamed));
    }

    #[test]
    fn non_bitcode_is_refused() {
        for bytes in [
            &b""[..],
            b"BC",
            b"\x7fELF",
            b"not bitcode at all",
            &MODULE[..MODULE.len() - 2],
        ] {
            assert!(
                matches!(shard_modules(bytes), Err(BitcodeError::NotBitcode(_))),
                "{bytes:?}"
            );
            assert!(
                matches!(module_hash(bytes), Err(BitcodeError::NotBitcode(_))),
                "{bytes:?}"
            );
        }
        let mut truncated = wrapped(SHARD);
        truncated[12] = 0xff;
        assert!(matches!(
            shard_modules(&truncated),
            Err(BitcodeError::NotBitcode(_))
        ));
    }

    /// Runs the three functions; they must return, whatever the input, and a canonical shard must read
    /// back and be left as it is by canonicalizing it again.
    fn exercise(bytes: &[u8]) {
        let _ = shard_modules(bytes);
        let _ = module_hash(bytes);
        if let Ok(rewritten) = canonicalize_shard(bytes, |entry| entry.path.repeat(2)) {
            shard_modules(&rewritten).expect("a rewritten shard parses");
            assert_eq!(
                canonicalize_shard(&rewritten, |entry| entry.path.clone()).as_ref(),
                Ok(&rewritten)
            );
        }
    }

    /// `base` with a few bytes changed, words inserted or removed, and perhaps cut short. Past the magic
    /// and in whole words, so that most mutants get past the container checks into the bitstream.
    fn mutated(base: &'static [u8]) -> impl Strategy<Value = Vec<u8>> {
        let edit = (any::<prop::sample::Index>(), any::<[u8; 4]>(), 0u8..4);
        (
            prop::collection::vec(edit, 1..8),
            any::<prop::sample::Index>(),
        )
            .prop_map(move |(edits, cut)| {
                let mut bytes = base.to_vec();
                for (at, word, kind) in edits {
                    let i = 4 + at.index(bytes.len().saturating_sub(4).max(1));
                    let i = i.min(bytes.len());
                    match kind {
                        0 if i < bytes.len() => bytes[i] = word[0],
                        1 if i < bytes.len() => bytes[i] ^= 1 << (word[0] % 8),
                        2 => drop(bytes.splice(i..i, word)),
                        _ => drop(bytes.drain(i..(i + 4).min(bytes.len()))),
                    }
                }
                if cut.index(8) == 0 {
                    bytes.truncate(cut.index(bytes.len() / 4 + 1) * 4);
                }
                bytes
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn mutated_shards_never_panic(bytes in mutated(SHARD)) {
            exercise(&bytes);
        }

        #[test]
        fn mutated_modules_never_panic(bytes in mutated(MODULE)) {
            exercise(&bytes);
        }

        #[test]
        fn random_bytes_never_panic(tail in prop::collection::vec(any::<u8>(), 0..300), magic: bool) {
            let mut bytes = if magic { b"BC\xC0\xDE".to_vec() } else { Vec::new() };
            bytes.extend(tail);
            exercise(&bytes);
        }
    }
}
