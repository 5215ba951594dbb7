//! The input root of an action as REAPI Directory messages.
//!
//! REAPI names an input tree by the digest of its root Directory, which in turn names its children by
//! digest. For that digest to depend on content only, the messages must be canonical: entries sorted
//! by name, each name once, no empty path components. This module builds such a tree from a flat list
//! of `(path inside the root, file)` entries and returns every Directory blob that makes it up.

use std::collections::BTreeMap;

use bazel_remote_apis::build::bazel::remote::execution::v2::{Directory, DirectoryNode, FileNode};

use crate::reapi::digest::{self, Digest};

/// A file to place in an input root.
#[derive(Debug, Clone)]
pub struct TreeFile {
    pub digest: Digest,
    pub executable: bool,
}

/// An input root: its digest and every Directory blob in it (root included).
#[derive(Debug, Clone)]
pub struct InputTree {
    pub root_digest: Digest,
    pub directories: Vec<(Digest, Vec<u8>)>,
}

#[derive(Default)]
struct Node {
    files: BTreeMap<String, TreeFile>,
    dirs: BTreeMap<String, Node>,
}

/// Builds the tree from `(path, file)` pairs, where a path is `/`-separated, relative, without `.`
/// or `..` components. The same path given twice must name the same content; a path used both as a
/// file and as a directory is an error.
pub fn build_tree(
    entries: impl IntoIterator<Item = (String, TreeFile)>,
) -> Result<InputTree, String> {
    let mut root = Node::default();
    for (path, file) in entries {
        let components: Vec<&str> = path.split('/').collect();
        if components
            .iter()
            .any(|c| c.is_empty() || *c == "." || *c == "..")
        {
            return Err(format!("invalid path {path:?} in the input root"));
        }
        let (name, parents) = components
            .split_last()
            .ok_or_else(|| format!("empty path {path:?}"))?;
        let mut node = &mut root;
        for (depth, part) in parents.iter().enumerate() {
            if node.files.contains_key(*part) {
                return Err(format!(
                    "{} is both a file and a directory",
                    parents[..=depth].join("/")
                ));
            }
            node = node.dirs.entry((*part).to_owned()).or_default();
        }
        if node.dirs.contains_key(*name) {
            return Err(format!("{path} is both a file and a directory"));
        }
        if let Some(existing) = node.files.get(*name)
            && existing.digest != file.digest
        {
            return Err(format!("{path} is given twice with different contents"));
        }
        node.files.insert((*name).to_owned(), file);
    }
    let mut directories = Vec::new();
    let root_digest = emit(root, &mut directories);
    Ok(InputTree {
        root_digest,
        directories,
    })
}

/// Serializes `node` and its subdirectories depth first, returning the node's digest.
fn emit(node: Node, out: &mut Vec<(Digest, Vec<u8>)>) -> Digest {
    let directories = node
        .dirs
        .into_iter()
        .map(|(name, child)| DirectoryNode {
            name,
            digest: Some(emit(child, out)),
        })
        .collect();
    let files = node
        .files
        .into_iter()
        .map(|(name, file)| FileNode {
            name,
            digest: Some(file.digest),
            is_executable: file.executable,
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

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    fn file(content: &[u8]) -> TreeFile {
        TreeFile {
            digest: digest::of_bytes(content),
            executable: false,
        }
    }

    #[test]
    fn canonical_regardless_of_order_and_duplicates() {
        let a = build_tree([
            ("b/x.o".to_owned(), file(b"x")),
            ("a (1).o".to_owned(), file(b"a")),
        ])
        .unwrap();
        let b = build_tree([
            ("a (1).o".to_owned(), file(b"a")),
            ("b/x.o".to_owned(), file(b"x")),
            ("a (1).o".to_owned(), file(b"a")),
        ])
        .unwrap();
        assert_eq!(a.root_digest, b.root_digest);
        assert_eq!(a.directories.len(), 2);
        let (root_digest, root_bytes) = a.directories.last().unwrap();
        assert_eq!(root_digest, &a.root_digest);
        let root = Directory::decode(root_bytes.as_slice()).unwrap();
        assert_eq!(root.files[0].name, "a (1).o");
        assert_eq!(root.directories[0].name, "b");
    }

    #[test]
    fn executable_bit_changes_the_digest() {
        let plain = build_tree([("t".to_owned(), file(b"t"))]).unwrap();
        let mut exe = file(b"t");
        exe.executable = true;
        let exe = build_tree([("t".to_owned(), exe)]).unwrap();
        assert_ne!(plain.root_digest, exe.root_digest);
    }

    #[test]
    fn conflicts_are_errors() {
        assert!(
            build_tree([("a".to_owned(), file(b"1")), ("a/b".to_owned(), file(b"2"))]).is_err()
        );
        assert!(
            build_tree([("a/b".to_owned(), file(b"1")), ("a".to_owned(), file(b"2"))]).is_err()
        );
        assert!(build_tree([("a".to_owned(), file(b"1")), ("a".to_owned(), file(b"2"))]).is_err());
        assert!(build_tree([("../a".to_owned(), file(b"1"))]).is_err());
        assert!(build_tree([("a//b".to_owned(), file(b"1"))]).is_err());
    }
}
