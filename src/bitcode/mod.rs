//! A reader and writer for the LLVM bitstream container, enough to read and rewrite the module paths of
//! ThinLTO index shards and to read a module's hash, in pure Rust.
//!
//! lld writes, for each ThinLTO backend job, an index shard (`*.native.o.thinlto.bc`) whose
//! MODULE_STRTAB block records the path and hash of the job's module and of each module it imports from;
//! the backend compile opens the imported modules by those paths. [`rewrite_shard_paths`] lets a
//! distributor give the modules canonical names (so that actions are cacheable and relocatable), and
//! [`module_hash`] matches each shard entry to an input file by content.
//!
//! Every function accepts any bytes: malformed input gives a [`BitcodeError`] saying what is wrong and at
//! which bit, never a panic, and the work is bounded by the input's length.
//!
//! Layout: `bitstream` (bits, abbreviations, BLOCKINFO, the block walk), `container` (raw, wrapped or
//! ELF-embedded bitcode), `shard` (MODULE_STRTAB read and rewrite), `module` (a module's hash).

mod bitstream;
mod container;
mod module;
mod shard;

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

/// One module recorded in an index shard's MODULE_STRTAB.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleEntry {
    /// The module's ID in the summary, which refers to modules by ID only.
    pub id: u64,
    /// The path the backend compile opens the module by, as the link named it (arbitrary bytes).
    pub path: Vec<u8>,
    /// The module's hash, equal to [`module_hash`] of its bitcode; `None` if the shard records none.
    pub hash: Option<[u32; 5]>,
}

/// Module paths (and hashes) recorded in an index shard's MODULE_STRTAB, in file order.
///
/// The shard's own module is among them, with the modules its backend imports from.
pub fn shard_modules(shard: &[u8]) -> Result<Vec<ModuleEntry>, BitcodeError> {
    shard::shard_modules(shard)
}

/// The same shard with each module path replaced by `new_path(entry)`; every other byte kept.
///
/// `new_path` is called once per entry, in file order. Only the MODULE_STRTAB block is re-emitted, with
/// the length words around it adjusted: a backend compile with the rewritten shard, given the modules
/// under their new paths, produces the same native object. Returning each entry's own path gives back
/// the input unchanged.
pub fn rewrite_shard_paths(
    shard: &[u8],
    new_path: impl FnMut(&ModuleEntry) -> Vec<u8>,
) -> Result<Vec<u8>, BitcodeError> {
    shard::rewrite_shard_paths(shard, new_path)
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
    fn rewriting_changes_only_the_paths() {
        assert_eq!(
            rewrite_shard_paths(SHARD, |entry| entry.path.clone()).unwrap(),
            SHARD
        );
        let renamed = rewrite_shard_paths(SHARD, |entry| {
            format!("cas/{}/m{}.o", "x".repeat(40), entry.id).into_bytes()
        })
        .unwrap();
        assert_ne!(renamed.len(), SHARD.len());
        assert_eq!(
            paths(&renamed)[2],
            format!("cas/{}/m2.o", "x".repeat(40)).into_bytes()
        );
        let hashes = |shard| {
            shard_modules(shard)
                .unwrap()
                .into_iter()
                .map(|entry| entry.hash)
                .collect::<Vec<_>>()
        };
        assert_eq!(hashes(&renamed), hashes(SHARD));
        // Back to the original names: LLVM's abbreviations are used again, so the bytes come back exactly.
        let originals = paths(SHARD);
        let restored =
            rewrite_shard_paths(&renamed, |entry| originals[entry.id as usize].clone()).unwrap();
        assert_eq!(restored, SHARD);
        // Shorter names, and names LLVM would encode as 8-bit characters.
        for name in ["a", "é/\u{1F381}.o", ""] {
            let rewritten = rewrite_shard_paths(SHARD, |_| name.as_bytes().to_vec()).unwrap();
            assert!(paths(&rewritten).iter().all(|path| path == name.as_bytes()));
            assert_eq!(
                rewrite_shard_paths(&rewritten, |entry| originals[entry.id as usize].clone())
                    .unwrap(),
                SHARD
            );
        }
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
        let renamed = rewrite_shard_paths(SHARD, |entry| {
            format!("renamed-module-{}.o", entry.id).into_bytes()
        })
        .unwrap();
        let renamed_wrapped = rewrite_shard_paths(&wrapped(SHARD), |entry| {
            format!("renamed-module-{}.o", entry.id).into_bytes()
        });
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

    /// Runs the three functions; they must return, whatever the input.
    fn exercise(bytes: &[u8]) {
        let _ = shard_modules(bytes);
        let _ = module_hash(bytes);
        if let Ok(rewritten) = rewrite_shard_paths(bytes, |entry| entry.path.repeat(2)) {
            shard_modules(&rewritten).expect("a rewritten shard parses");
        }
    }

    fn mutated(base: &'static [u8]) -> impl Strategy<Value = Vec<u8>> {
        let edits =
            prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..4), 1..8);
        (edits, any::<prop::sample::Index>()).prop_map(move |(edits, cut)| {
            let mut bytes = base.to_vec();
            for (at, value, kind) in edits {
                let i = at.index(bytes.len());
                match kind {
                    0 => bytes[i] = value,
                    1 => bytes[i] ^= 1 << (value % 8),
                    2 => bytes.insert(i, value),
                    _ => {
                        bytes.remove(i);
                    }
                }
            }
            if cut.index(8) == 0 {
                bytes.truncate(cut.index(bytes.len()));
            }
            bytes
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

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
