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

/// The most bytes of output files one action may leave; more is an action error.
pub const MAX_OUTPUT_BYTES: u64 = 1 << 30;

/// The most files, directories and symlinks one action's outputs may hold; more is an action
/// error.
pub const MAX_OUTPUT_ENTRIES: u64 = 100_000;

/// What is left of an action's output allowance.
struct Budget {
    bytes: u64,
    entries: u64,
}

impl Budget {
    /// Takes one entry of `bytes` bytes (`path` for the error).
    fn take(&mut self, path: &Path, bytes: u64) -> Result<(), Status> {
        if self.entries == 0 {
            return Err(Status::invalid_argument(format!(
                "the action's outputs hold more than {MAX_OUTPUT_ENTRIES} files, directories and \
                 symlinks (at {}), more than this server collects",
                path.display()
            )));
        }
        if bytes > self.bytes {
            return Err(Status::invalid_argument(format!(
                "the action's output files hold more than {MAX_OUTPUT_BYTES} bytes (at {}), more \
                 than this server collects",
                path.display()
            )));
        }
        self.entries -= 1;
        self.bytes -= bytes;
        Ok(())
    }
}

/// The content of the file at `path`, which may hold at most `cap` bytes (`what` names it in
/// the error): more is an action error, and no more than `cap` + 1 bytes are ever read.
pub fn read_capped(path: &Path, cap: u64, what: &str) -> Result<Vec<u8>, Status> {
    use std::io::Read as _;
    let file = std::fs::File::open(path).map_err(|e| io_error(path, e))?;
    let mut data = Vec::new();
    file.take(cap.saturating_add(1))
        .read_to_end(&mut data)
        .map_err(|e| io_error(path, e))?;
    if data.len() as u64 > cap {
        return Err(Status::invalid_argument(format!(
            "the action's {what} holds more than {cap} bytes, more than this server collects"
        )));
    }
    Ok(data)
}

/// One output as the Command names it, and where it is relative to the action's root.
pub struct OutputPath {
    pub name: String,
    pub rel: PathBuf,
}

/// Where an action runs and what it leaves, all relative to the action's root and checked.
pub struct Layout {
    pub working_dir: PathBuf,
    pub outputs: Vec<OutputPath>,
}

/// The checked working directory and outputs of `command`.
pub fn plan(command: &Command) -> Result<Layout, Status> {
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
    Ok(Layout {
        working_dir,
        outputs,
    })
}

/// Creates the working directory and the parents of every output.
pub fn prepare(root: &Path, layout: &Layout) -> Result<(), Status> {
    create_dirs(root, &layout.working_dir)?;
    for output in &layout.outputs {
        create_dirs(root, output.rel.parent().unwrap_or(Path::new("")))?;
    }
    Ok(())
}

fn io_error(path: &Path, e: std::io::Error) -> Status {
    Status::internal(format!("cannot collect output {}: {e}", path.display()))
}

fn upload_file(
    storage: &Storage,
    path: &Path,
    budget: &mut Budget,
) -> Result<(BlobDigest, bool), Status> {
    let meta = std::fs::metadata(path).map_err(|e| io_error(path, e))?;
    budget.take(path, meta.len())?;
    let data = read_capped(path, meta.len(), "output file")?;
    Ok((
        storage.add_blob(&data)?,
        meta.permissions().mode() & 0o111 != 0,
    ))
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
    budget: &mut Budget,
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
        if !kind.is_file() {
            budget.take(&entry_path, 0)?;
        }
        if kind.is_symlink() {
            directory.symlinks.push(SymlinkNode {
                name,
                target: read_link(&entry_path)?,
                ..Default::default()
            });
        } else if kind.is_dir() {
            let child = collect_directory(storage, &entry_path, children, depth + 1, budget)?;
            let digest = storage.add_blob(&child.encode_to_vec())?;
            children.push(child);
            directory.directories.push(DirectoryNode {
                name,
                digest: Some(digest.to_proto()),
            });
        } else if kind.is_file() {
            let (digest, is_executable) = upload_file(storage, &entry_path, budget)?;
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
/// as the REAPI specifies; the client decides whether that is an error. More than
/// [`MAX_OUTPUT_BYTES`] or [`MAX_OUTPUT_ENTRIES`] in all is an action error.
pub fn collect(
    storage: &Storage,
    root: &Path,
    outputs: &[OutputPath],
    result: &mut ActionResult,
) -> Result<(), Status> {
    let budget = &mut Budget {
        bytes: MAX_OUTPUT_BYTES,
        entries: MAX_OUTPUT_ENTRIES,
    };
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
            let root_directory = collect_directory(storage, &path, &mut children, 0, budget)?;
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
            let (digest, is_executable) = upload_file(storage, &path, budget)?;
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
