//! Materializes an action's input root from the CAS into a fresh directory. The whole tree is
//! fetched and checked before anything is written: every entry name must be a single path
//! component, unique in its directory, symlink targets must be relative, and every blob must be
//! present (missing ones are all reported at once, so that the client can upload them and retry).
//! Big files are hard links to shared copies ([`SharedFiles`]) where actions cannot write those;
//! the rest, and everything where they could, are written afresh for each action.

use super::context::missing_blobs;
use super::digest::BlobDigest;
use super::shared_files::{LINK_THRESHOLD, SharedFiles};
use super::storage::Storage;
use bazel_remote_apis::build::bazel::remote::execution::v2::Directory;
use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use tonic::Status;

/// The most files, directories and symlinks one input root may expand to: a small tree that
/// names the same subdirectory many times over could otherwise expand without bound.
const MAX_NODES: usize = 1_000_000;

fn check_name(name: &str, parent: &BlobDigest) -> Result<(), Status> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(Status::invalid_argument(format!(
            "directory {parent} has an entry named {name:?}, which is not a single path component"
        )));
    }
    Ok(())
}

/// Checks one Directory's entries, returning the digests of its subdirectories.
fn check_directory(digest: &BlobDigest, directory: &Directory) -> Result<Vec<BlobDigest>, Status> {
    let names = directory
        .files
        .iter()
        .map(|f| &f.name)
        .chain(directory.directories.iter().map(|d| &d.name))
        .chain(directory.symlinks.iter().map(|s| &s.name));
    let mut seen = HashSet::new();
    for name in names {
        check_name(name, digest)?;
        if !seen.insert(name) {
            return Err(Status::invalid_argument(format!(
                "directory {digest} names {name:?} twice"
            )));
        }
    }
    for symlink in &directory.symlinks {
        let target = &symlink.target;
        if target.is_empty() || target.starts_with('/') || target.contains('\0') {
            return Err(Status::invalid_argument(format!(
                "symlink {:?} in {digest} has target {target:?}; only relative targets are allowed",
                symlink.name
            )));
        }
    }
    for file in &directory.files {
        BlobDigest::required(file.digest.as_ref(), "file node digest")?;
    }
    directory
        .directories
        .iter()
        .map(|d| BlobDigest::required(d.digest.as_ref(), "directory node digest"))
        .collect()
}

/// Fetches and checks every Directory of the tree, and checks that every file blob is present.
fn fetch_tree(
    storage: &Storage,
    root: &BlobDigest,
) -> Result<HashMap<BlobDigest, Directory>, Status> {
    let mut tree = HashMap::new();
    let mut missing = Vec::new();
    let mut pending = vec![root.clone()];
    while let Some(digest) = pending.pop() {
        if tree.contains_key(&digest) {
            continue;
        }
        let Some(directory) = storage.message::<Directory>(&digest)? else {
            missing.push(digest);
            continue;
        };
        pending.extend(check_directory(&digest, &directory)?);
        tree.insert(digest, directory);
    }
    let files: HashSet<BlobDigest> = tree
        .values()
        .flat_map(|d| &d.files)
        .filter_map(|f| {
            f.digest
                .as_ref()
                .and_then(|d| BlobDigest::from_proto(d).ok())
        })
        .collect();
    for file in files {
        if !storage.has_blob(&file)? {
            missing.push(file);
        }
    }
    if !missing.is_empty() {
        missing.sort();
        return Err(missing_blobs("the input root is incomplete", &missing));
    }
    Ok(tree)
}

/// Writes the input root `root` into the existing, empty directory `dir`, linking big files to
/// `shared` copies when given.
pub fn materialize(
    storage: &Storage,
    shared: Option<&SharedFiles>,
    root: &BlobDigest,
    dir: &Path,
) -> Result<(), Status> {
    let tree = fetch_tree(storage, root)?;
    let io = |path: &Path, e: std::io::Error| {
        Status::internal(format!("cannot materialize {}: {e}", path.display()))
    };
    let mut nodes = 0usize;
    let mut pending: Vec<(&BlobDigest, PathBuf)> = vec![(root, dir.to_path_buf())];
    while let Some((digest, path)) = pending.pop() {
        let directory = tree.get(digest).ok_or_else(|| {
            Status::internal(format!("directory {digest} vanished while materializing"))
        })?;
        nodes += directory.files.len() + directory.directories.len() + directory.symlinks.len();
        if nodes > MAX_NODES {
            return Err(Status::invalid_argument(format!(
                "the input root expands to more than {MAX_NODES} entries"
            )));
        }
        for file in &directory.files {
            let target = path.join(&file.name);
            let blob = BlobDigest::required(file.digest.as_ref(), "file node digest")?;
            if let Some(shared) = shared
                && blob.size >= LINK_THRESHOLD
            {
                shared.place(storage, &blob, file.is_executable, &target)?;
                continue;
            }
            let data = storage.blob(&blob)?.ok_or_else(|| {
                missing_blobs("the input root is incomplete", std::slice::from_ref(&blob))
            })?;
            // create_new: names are unique per directory, so this never follows a symlink.
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(if file.is_executable { 0o755 } else { 0o644 })
                .open(&target)
                .and_then(|mut f| f.write_all(&data))
                .map_err(|e| io(&target, e))?;
        }
        for symlink in &directory.symlinks {
            let target = path.join(&symlink.name);
            std::os::unix::fs::symlink(&symlink.target, &target).map_err(|e| io(&target, e))?;
        }
        for child in &directory.directories {
            let target = path.join(&child.name);
            std::fs::create_dir(&target).map_err(|e| io(&target, e))?;
            let child_digest = tree
                .get_key_value(&BlobDigest::required(
                    child.digest.as_ref(),
                    "directory node digest",
                )?)
                .map(|(k, _)| k)
                .ok_or_else(|| Status::internal("directory missing after fetch"))?;
            pending.push((child_digest, target));
        }
    }
    Ok(())
}
