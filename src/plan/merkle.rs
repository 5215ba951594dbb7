//! The input root of an action as REAPI Directory messages.
//!
//! REAPI names an input tree by the digest of its root Directory, which in turn names its children by
//! digest. For that digest to depend on content only, the messages must be canonical: entries sorted
//! by name, each name once, no empty path components. This module builds such a tree from a flat list
//! of `(path inside the root, file)` entries and returns every Directory blob that makes it up.
//!
//! Every job of a link builds a tree of ~100 files, so the Directory messages are encoded straight
//! from the sorted entries, field by field with prost's encoding primitives, instead of through
//! owned `Directory` messages (two allocations per file); a test checks the bytes against prost's
//! own encoding of the same message.

use bazel_remote_apis::build::bazel::remote::execution::v2::Digest;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};

use crate::reapi::digest;

/// A file to place in an input root: its path inside the root (`/`-separated, relative, without
/// `.` or `..` components), its content and whether it is executable.
#[derive(Debug, Clone, Copy)]
pub struct TreeEntry<'a> {
    pub path: &'a str,
    pub digest: &'a Digest,
    pub executable: bool,
}

/// An input root: its digest and every Directory blob in it (root included, last).
#[derive(Debug, Clone)]
pub struct InputTree {
    pub root_digest: Digest,
    pub directories: Vec<(Digest, Vec<u8>)>,
}

/// Builds the tree of `entries`. The same path given twice must name the same content; a path used
/// both as a file and as a directory is an error.
pub fn build_tree(mut entries: Vec<TreeEntry<'_>>) -> Result<InputTree, String> {
    for entry in &entries {
        let path = entry.path;
        if path
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
        {
            return Err(format!("invalid path {path:?} in the input root"));
        }
    }
    // Component by component, which is byte order with `/` below every other byte: a directory's
    // entries are then contiguous, in name order, right after a file of the same name.
    entries.sort_unstable_by(|a, b| sort_key(a.path).cmp(sort_key(b.path)));
    let mut directories = Vec::new();
    let root_digest = emit(&entries, 0, &mut directories)?;
    Ok(InputTree {
        root_digest,
        directories,
    })
}

/// A path's bytes with `/` as the lowest byte.
fn sort_key(path: &str) -> impl Iterator<Item = u8> + '_ {
    path.bytes().map(|b| if b == b'/' { 0 } else { b })
}

/// Encodes the directory whose entries are `entries` (sorted, their paths all starting with the
/// directory's own path, `prefix` bytes long with its `/`), its subdirectories first, and returns
/// its digest.
fn emit(
    entries: &[TreeEntry<'_>],
    prefix: usize,
    out: &mut Vec<(Digest, Vec<u8>)>,
) -> Result<Digest, String> {
    // Directory: `files` (field 1) then `directories` (field 2), each entry a length-delimited
    // message, as prost writes repeated message fields.
    let mut files = Vec::with_capacity(entries.len() * 160);
    let mut dirs = Vec::new();
    let mut last_file: Option<&TreeEntry<'_>> = None;
    let mut i = 0;
    while i < entries.len() {
        let entry = &entries[i];
        let rest = &entry.path[prefix..];
        if let Some(slash) = rest.find('/') {
            let name = &rest[..slash];
            let inner = prefix + slash + 1;
            let end = i + entries[i..]
                .iter()
                .take_while(|e| {
                    e.path.len() > inner
                        && e.path.as_bytes()[inner - 1] == b'/'
                        && &e.path[prefix..inner - 1] == name
                })
                .count();
            if last_file.is_some_and(|f| &f.path[prefix..] == name) {
                return Err(format!(
                    "{} is both a file and a directory",
                    &entry.path[..inner - 1]
                ));
            }
            let digest = emit(&entries[i..end], inner, out)?;
            encode_node(&mut dirs, 2, name, &digest, false);
            i = end;
        } else {
            match last_file {
                Some(last) if last.path == entry.path => {
                    if last.digest != entry.digest {
                        return Err(format!(
                            "{} is given twice with different contents",
                            entry.path
                        ));
                    }
                }
                _ => encode_node(&mut files, 1, rest, entry.digest, entry.executable),
            }
            last_file = Some(entry);
            i += 1;
        }
    }
    files.extend_from_slice(&dirs);
    let digest = digest::of_bytes(&files);
    out.push((digest.clone(), files));
    Ok(digest)
}

/// Appends a `FileNode` or a `DirectoryNode` (they share fields 1 and 2; `executable` is false for
/// a directory) as one length-delimited entry of field `field` of a `Directory` (1: files, 2:
/// directories): `name` (1), `digest` (2, with `hash` 1 and `size_bytes` 2), `is_executable` (4),
/// each left out when empty, as proto3 does.
fn encode_node(out: &mut Vec<u8>, field: u32, name: &str, digest: &Digest, executable: bool) {
    let string_len = |s: &str| {
        if s.is_empty() {
            0
        } else {
            key_len(1) + encoded_len_varint(s.len() as u64) + s.len()
        }
    };
    let size = digest.size_bytes as u64;
    let digest_len = string_len(&digest.hash)
        + if size == 0 {
            0
        } else {
            key_len(2) + encoded_len_varint(size)
        };
    let node_len = string_len(name)
        + key_len(2)
        + encoded_len_varint(digest_len as u64)
        + digest_len
        + if executable { key_len(4) + 1 } else { 0 };
    let put_string = |out: &mut Vec<u8>, tag: u32, s: &str| {
        if !s.is_empty() {
            encode_key(tag, WireType::LengthDelimited, out);
            encode_varint(s.len() as u64, out);
            out.extend_from_slice(s.as_bytes());
        }
    };
    out.reserve(key_len(field) + encoded_len_varint(node_len as u64) + node_len);
    encode_key(field, WireType::LengthDelimited, out);
    encode_varint(node_len as u64, out);
    put_string(out, 1, name);
    encode_key(2, WireType::LengthDelimited, out);
    encode_varint(digest_len as u64, out);
    put_string(out, 1, &digest.hash);
    if size != 0 {
        encode_key(2, WireType::Varint, out);
        encode_varint(size, out);
    }
    if executable {
        encode_key(4, WireType::Varint, out);
        encode_varint(1, out);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use bazel_remote_apis::build::bazel::remote::execution::v2::{
        Directory, DirectoryNode, FileNode,
    };
    use prost::Message;

    use super::*;

    fn tree(entries: &[(&str, &Digest)]) -> Result<InputTree, String> {
        build_tree(
            entries
                .iter()
                .map(|&(path, digest)| TreeEntry {
                    path,
                    digest,
                    executable: false,
                })
                .collect(),
        )
    }

    #[test]
    fn canonical_regardless_of_order_and_duplicates() {
        let (x, a) = (digest::of_bytes(b"x"), digest::of_bytes(b"a"));
        let one = tree(&[("b/x.o", &x), ("a (1).o", &a)]).unwrap();
        let two = tree(&[("a (1).o", &a), ("b/x.o", &x), ("a (1).o", &a)]).unwrap();
        assert_eq!(one.root_digest, two.root_digest);
        assert_eq!(one.directories.len(), 2);
        let (root_digest, root_bytes) = one.directories.last().unwrap();
        assert_eq!(root_digest, &one.root_digest);
        let root = Directory::decode(root_bytes.as_slice()).unwrap();
        assert_eq!(root.files[0].name, "a (1).o");
        assert_eq!(root.directories[0].name, "b");
    }

    #[test]
    fn executable_bit_changes_the_digest() {
        let t = digest::of_bytes(b"t");
        let entry = |executable| TreeEntry {
            path: "t",
            digest: &t,
            executable,
        };
        let plain = build_tree(vec![entry(false)]).unwrap();
        let exe = build_tree(vec![entry(true)]).unwrap();
        assert_ne!(plain.root_digest, exe.root_digest);
    }

    #[test]
    fn conflicts_are_errors() {
        let (one, two) = (digest::of_bytes(b"1"), digest::of_bytes(b"2"));
        assert!(tree(&[("a", &one), ("a/b", &two)]).is_err());
        assert!(tree(&[("a/b", &one), ("a", &two)]).is_err());
        assert!(tree(&[("a/b/c", &one), ("a/b", &two)]).is_err());
        assert!(tree(&[("a", &one), ("a", &two)]).is_err());
        assert!(tree(&[("../a", &one)]).is_err());
        assert!(tree(&[("a//b", &one)]).is_err());
        assert!(tree(&[("a/", &one)]).is_err());
        assert!(tree(&[("", &one)]).is_err());
        // A name that only starts like a directory's is another entry.
        assert!(tree(&[("a", &one), ("a-b/c", &two), ("ab", &two)]).is_ok());
    }

    /// What the tree must be: owned prost messages, built level by level from sorted maps.
    fn reference(entries: &[(String, Digest, bool)]) -> (Digest, Vec<(Digest, Vec<u8>)>) {
        #[derive(Default)]
        struct Node {
            files: BTreeMap<String, (Digest, bool)>,
            dirs: BTreeMap<String, Node>,
        }
        fn encode(node: Node, out: &mut Vec<(Digest, Vec<u8>)>) -> Digest {
            let directories = node
                .dirs
                .into_iter()
                .map(|(name, child)| DirectoryNode {
                    name,
                    digest: Some(encode(child, out)),
                })
                .collect();
            let files = node
                .files
                .into_iter()
                .map(|(name, (digest, is_executable))| FileNode {
                    name,
                    digest: Some(digest),
                    is_executable,
                    ..Default::default()
                })
                .collect();
            let directory = Directory {
                files,
                directories,
                ..Default::default()
            };
            let (digest, bytes) = digest::of_message(&directory);
            out.push((digest.clone(), bytes));
            digest
        }
        let mut root = Node::default();
        for (path, digest, executable) in entries {
            let mut parts: Vec<&str> = path.split('/').collect();
            let name = parts.pop().unwrap();
            let mut node = &mut root;
            for part in parts {
                node = node.dirs.entry(part.to_owned()).or_default();
            }
            node.files
                .insert(name.to_owned(), (digest.clone(), *executable));
        }
        let mut out = Vec::new();
        (encode(root, &mut out), out)
    }

    proptest::proptest! {
        /// The hand-encoded Directories are byte for byte what prost encodes for the same tree.
        #[test]
        fn the_same_bytes_as_prost(
            files in proptest::collection::btree_map(
                "([a-c]{1,2}/){0,3}[a-c(][a-c.(]{0,2}",
                (proptest::collection::vec(proptest::num::u8::ANY, 0..3), -1i64..300, proptest::bool::ANY),
                1..12,
            ),
        ) {
            let entries: Vec<(String, Digest, bool)> = files
                .into_iter()
                .map(|(path, (content, size, executable))| {
                    let mut digest = digest::of_bytes(&content);
                    digest.size_bytes = size;
                    if content.is_empty() {
                        digest.hash.clear();
                    }
                    (path, digest, executable)
                })
                .collect();
            let built = build_tree(
                entries
                    .iter()
                    .map(|(path, digest, executable)| TreeEntry { path, digest, executable: *executable })
                    .collect(),
            );
            // A path that is both a file and a directory has no tree; any other set has the one
            // prost encodes.
            let conflict = entries.iter().any(|(a, ..)| {
                entries.iter().any(|(b, ..)| b.len() > a.len() && b.starts_with(a.as_str()) && b.as_bytes()[a.len()] == b'/')
            });
            match built {
                Err(_) => proptest::prop_assert!(conflict),
                Ok(tree) => {
                    proptest::prop_assert!(!conflict);
                    let (root, directories) = reference(&entries);
                    proptest::prop_assert_eq!(tree.root_digest, root);
                    proptest::prop_assert_eq!(tree.directories, directories);
                }
            }
        }
    }
}
