//! An action's outputs: which paths the Command names (checked, and their parent directories
//! created, before it runs) and, afterwards, what was found there, uploaded to the CAS as
//! OutputFiles, OutputDirectories (as Tree blobs) and OutputSymlinks. Symlinks are reported as
//! symlinks, never followed.

use super::digest::BlobDigest;
use super::paths::{confine, create_dirs, parents_are_real};
use super::storage::Storage;
use bazel_remote_apis::build::bazel::remote::execution::v2::{
    ActionResult, Command, Directory, DirectoryNode, FileNode, OutputDirectory, OutputFile,
    OutputSymlink, SymlinkNode, Tree,
};
use prost::Message;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use tonic::Status;

/// Deepest output directory tree collected; deeper ones are refused rather than recursed into.
const MAX_DEPTH: usize = 256;

/// One output as the Command names it, and where it is relative to the action's root.
pub struct OutputPath {
    pub name: String,
    pub rel: PathBuf,
}

/// The checked working directory (relative to the root) and outputs of `command`.
pub fn plan(command: &Command) -> Result<(PathBuf, Vec<OutputPath>), Status> {
    let working_dir = confine(
        Path::new(""),
        &command.working_directory,
        "working_directory",
    )?;
    // REAPI 2.1 clients list output_paths; older ones output_files and output_directories,
    // which this server still honours.
    #[allow(deprecated)]
    let names = if command.output_paths.is_empty() {
        command
            .output_files
            .iter()
            .chain(&command.output_directories)
            .collect::<Vec<_>>()
    } else {
        command.output_paths.iter().collect()
    };
    let outputs = names
        .into_iter()
        .map(|name| {
            let rel = confine(&working_dir, name, "output path")?;
            if rel.as_os_str().is_empty() || name.is_empty() {
                return Err(Status::invalid_argument(format!(
                    "output path {name:?} names the input root"
                )));
            }
            Ok(OutputPath {
                name: name.clone(),
                rel,
            })
        })
        .collect::<Result<_, _>>()?;
    Ok((working_dir, outputs))
}

/// Creates the working directory and the parents of every output.
pub fn prepare(root: &Path, working_dir: &Path, outputs: &[OutputPath]) -> Result<(), Status> {
    create_dirs(root, working_dir)?;
    for output in outputs {
        create_dirs(root, output.rel.parent().unwrap_or(Path::new("")))?;
    }
    Ok(())
}

fn io_error(path: &Path, e: std::io::Error) -> Status {
    Status::internal(format!("cannot collect output {}: {e}", path.display()))
}

fn upload_file(storage: &Storage, path: &Path) -> Result<(BlobDigest, bool), Status> {
    let data = std::fs::read(path).map_err(|e| io_error(path, e))?;
    let mode = std::fs::metadata(path)
        .map_err(|e| io_error(path, e))?
        .permissions()
        .mode();
    Ok((storage.add_blob(&data)?, mode & 0o111 != 0))
}

fn read_link(path: &Path) -> Result<String, Status> {
    let target = std::fs::read_link(path).map_err(|e| io_error(path, e))?;
    target
        .into_os_string()
        .into_string()
        .map_err(|_| Status::internal(format!("symlink {} has a non-UTF-8 target", path.display())))
}

/// Uploads the files under `path` and returns its Directory; every Directory below it is
/// appended to `children`.
fn collect_directory(
    storage: &Storage,
    path: &Path,
    children: &mut Vec<Directory>,
    depth: usize,
) -> Result<Directory, Status> {
    if depth > MAX_DEPTH {
        return Err(Status::internal(format!(
            "output directory {} is nested too deeply",
            path.display()
        )));
    }
    let mut entries = std::fs::read_dir(path)
        .and_then(|entries| entries.collect::<Result<Vec<_>, _>>())
        .map_err(|e| io_error(path, e))?;
    // Directory entries must be sorted by name.
    entries.sort_by_key(|entry| entry.file_name());
    let mut directory = Directory::default();
    for entry in entries {
        let entry_path = entry.path();
        let name = entry.file_name().into_string().map_err(|_| {
            Status::internal(format!(
                "output {} has a non-UTF-8 name",
                entry_path.display()
            ))
        })?;
        let kind = entry.file_type().map_err(|e| io_error(&entry_path, e))?;
        if kind.is_symlink() {
            directory.symlinks.push(SymlinkNode {
                name,
                target: read_link(&entry_path)?,
                ..Default::default()
            });
        } else if kind.is_dir() {
            let child = collect_directory(storage, &entry_path, children, depth + 1)?;
            let digest = storage.add_blob(&child.encode_to_vec())?;
            children.push(child);
            directory.directories.push(DirectoryNode {
                name,
                digest: Some(digest.to_proto()),
            });
        } else if kind.is_file() {
            let (digest, is_executable) = upload_file(storage, &entry_path)?;
            directory.files.push(FileNode {
                name,
                digest: Some(digest.to_proto()),
                is_executable,
                ..Default::default()
            });
        }
        // Sockets, pipes and devices cannot be represented and are left out.
    }
    Ok(directory)
}

/// Uploads what the action left at each output path into `result`. Missing outputs are skipped,
/// as the REAPI specifies; the client decides whether that is an error.
pub fn collect(
    storage: &Storage,
    root: &Path,
    outputs: &[OutputPath],
    result: &mut ActionResult,
) -> Result<(), Status> {
    for output in outputs {
        if !parents_are_real(root, &output.rel) {
            continue;
        }
        let path = root.join(&output.rel);
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.file_type().is_symlink() {
            result.output_symlinks.push(OutputSymlink {
                path: output.name.clone(),
                target: read_link(&path)?,
                ..Default::default()
            });
        } else if meta.is_dir() {
            let mut children = Vec::new();
            let root_directory = collect_directory(storage, &path, &mut children, 0)?;
            children.sort_by_key(|child| BlobDigest::of(&child.encode_to_vec()));
            children.dedup();
            let root_digest = storage.add_blob(&root_directory.encode_to_vec())?;
            let tree = Tree {
                root: Some(root_directory),
                children,
            };
            result.output_directories.push(OutputDirectory {
                path: output.name.clone(),
                tree_digest: Some(storage.add_blob(&tree.encode_to_vec())?.to_proto()),
                root_directory_digest: Some(root_digest.to_proto()),
                ..Default::default()
            });
        } else if meta.is_file() {
            let (digest, is_executable) = upload_file(storage, &path)?;
            result.output_files.push(OutputFile {
                path: output.name.clone(),
                digest: Some(digest.to_proto()),
                is_executable,
                ..Default::default()
            });
        }
    }
    Ok(())
}
