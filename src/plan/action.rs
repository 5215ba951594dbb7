//! The REAPI Action of a job: its Command, its input root and the blobs to upload for it.
//!
//! Everything that goes into the Action digest is derived from the job's content and the user's
//! remote settings: arguments with every file renamed by the layout, the environment of every
//! compile (`environment`: fixed, plus what `--pass-env` names), sorted platform properties, the
//! input root's digest. So the same module with the same
//! imports, flags and compiler gives the same digest on every link and every machine.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bazel_remote_apis::build::bazel::remote::execution::v2::{Action, Command, Platform, platform};
use serde::{Deserialize, Serialize};

use super::args::rewrite_args;
use super::digests::{FileDigests, FileInfo, InputPart};
use super::environment::Environment;
use super::layout::{Layout, SHARD_NAME};
use super::merkle::{TreeEntry, build_tree};
use super::options::{LayoutKind, ToolchainMode};
use super::toolchain::{Toolchain, ToolchainFile};
use crate::jobs::{Job, JobFile};
use crate::reapi::digest::{self, Digest};
use crate::reapi::{Blob, BlobSource};

/// Remote settings that shape every Action.
#[derive(Debug, Clone)]
pub struct ActionOptions {
    /// The link's compiler: its identity is in every Action; in upload mode its files are inputs.
    pub toolchain: Arc<Toolchain>,
    /// Upload mode: the toolchain's files as blobs, shared by every job.
    pub toolchain_blobs: Arc<[Blob]>,
    /// Replaces `common.args[0]` in worker mode (the compiler's path on the workers).
    pub remote_compiler: Option<String>,
    /// Platform properties, set on both the Command and the Action.
    pub platform: Vec<(String, String)>,
    /// The environment of every compile, local or remote.
    pub environment: Arc<Environment>,
    /// Use the pre-2.1 `output_files` field instead of `output_paths`.
    pub legacy_output_files: bool,
}

/// A job ready for remote execution.
#[derive(Debug)]
pub struct ActionSpec {
    pub action_digest: Digest,
    /// The blobs made for the action: Action, Command, Directories and generated inputs (with
    /// `input_files` and `toolchain_blobs`, all it needs in the CAS).
    pub blobs: Vec<Blob>,
    /// The input files taken as they are (their blobs are made only for an upload: most
    /// Actions of a relink are cache hits).
    pub input_files: Vec<Arc<FileInfo>>,
    /// `(path relative to the working directory, local path lld expects)` for every output.
    pub outputs: Vec<(String, PathBuf)>,
    pub layout: LayoutKind,
    /// Upload mode: the toolchain's files (not in `blobs`), the same for every job of the link.
    pub toolchain_blobs: Arc<[Blob]>,
    /// What the Action digest is made of, for `dtlto-reapi explain`.
    pub parts: Arc<ActionParts>,
    /// Whether a local compile of the job is the Action's computation (false when
    /// `--upload-compiler` names another compiler): only then are its results stored under the
    /// Action's digest.
    pub local_is_action: bool,
}

impl Assembled {
    /// Every blob the action needs in the CAS but the toolchain's files.
    pub fn into_blobs(self) -> Vec<Blob> {
        file_blobs(&self.input_files).chain(self.blobs).collect()
    }
}

/// The blobs of input files, read from where the link has them when uploaded.
fn file_blobs(files: &[Arc<FileInfo>]) -> impl Iterator<Item = Blob> + '_ {
    files
        .iter()
        .map(|file| Blob::from_file(file.local.to_path_buf(), file.digest.clone()))
}

/// The platform of `properties`, sorted as REAPI requires; `None` without any.
fn platform(properties: &[(String, String)]) -> Option<Platform> {
    let mut properties: Vec<platform::Property> = properties
        .iter()
        .map(|(name, value)| platform::Property {
            name: name.clone(),
            value: value.clone(),
        })
        .collect();
    properties.sort_by(|a, b| (&a.name, &a.value).cmp(&(&b.name, &b.value)));
    (!properties.is_empty()).then_some(Platform { properties })
}

/// The parts of a job's Action, each by digest (`hash/size`) or value, as `--stats-json` records
/// them: two links' records say which part made a job miss.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActionParts {
    /// The Command message.
    pub command: String,
    /// The input root Directory.
    pub input_root: String,
    /// The compiler's identity: the digest of its content (and of what it needs to run), the
    /// same at any path.
    pub compiler: String,
    /// The flags every backend compile of the link shares (`common.args` after the compiler).
    pub flags: Vec<String>,
    /// The platform properties, `NAME=VALUE`, sorted.
    pub platform: Vec<String>,
    /// The module itself (shared by every Action of the link that has it, as the imports are).
    pub module: Arc<InputPart>,
    /// Its index shard, as the action sees it (rewritten, in the canonical layout).
    pub index_shard: InputPart,
    /// The modules it imports from.
    pub imports: Vec<Arc<InputPart>>,
}

/// Builds the Action of `job` in `layout`.
pub fn build(
    job_file: &JobFile,
    job: &Job,
    layout: Layout,
    digests: &FileDigests,
    options: &ActionOptions,
) -> Result<ActionSpec, String> {
    let rename = |arg: &str| layout.renames.get(arg).cloned();
    let mut arguments = Vec::with_capacity(job_file.common_args.len() + job.args.len());
    arguments.extend(rewrite_args(&job_file.common_args[1..], rename));
    arguments.extend(rewrite_args(&job.args, rename));
    let assembled = assemble(job_file.compiler(), arguments, &layout, digests, options)?;

    // Each input file's part was made once for the link, when it was hashed.
    let part_of = |path: &Path| {
        digests.get(path).map_or_else(
            || {
                Arc::new(InputPart {
                    path: path.to_owned(),
                    digest: String::new(),
                })
            },
            |info| info.part.clone(),
        )
    };
    let parts = ActionParts {
        command: digest::display(&assembled.command_digest).to_string(),
        input_root: digest::display(&assembled.input_root).to_string(),
        compiler: digest::display(&options.toolchain.identity.digest).to_string(),
        flags: job_file.common_args.iter().skip(1).cloned().collect(),
        platform: assembled.platform,
        module: part_of(job.module()),
        index_shard: InputPart {
            path: job.index_shard().to_owned(),
            digest: assembled
                .rewritten_shard
                .as_ref()
                .or_else(|| digests.get(job.index_shard()).map(|info| &info.digest))
                .map_or_else(String::new, |d| digest::display(d).to_string()),
        },
        imports: job.imports().iter().map(|import| part_of(import)).collect(),
    };
    Ok(ActionSpec {
        action_digest: assembled.action_digest,
        blobs: assembled.blobs,
        input_files: assembled.input_files,
        outputs: layout.outputs,
        layout: layout.kind,
        toolchain_blobs: options.toolchain_blobs.clone(),
        parts: Arc::new(parts),
        local_is_action: options.toolchain.local_is_uploaded,
    })
}

/// A Command and its Action, hashed, with the blobs that make them up.
#[derive(Debug)]
pub struct Assembled {
    pub action_digest: Digest,
    pub command_digest: Digest,
    pub input_root: Digest,
    /// Action, Command, Directories and generated inputs; not the input files taken as they are
    /// (`input_files`) nor the toolchain's files (see [`ActionOptions::toolchain_blobs`]).
    pub blobs: Vec<Blob>,
    pub input_files: Vec<Arc<FileInfo>>,
    /// The platform properties, `NAME=VALUE`, sorted.
    pub platform: Vec<String>,
    /// The digest of the index shard the layout rewrote, if it did.
    pub rewritten_shard: Option<Digest>,
}

/// The one builder of Actions, for a link's jobs and for `check`'s probe alike: `compiler`
/// followed by `arguments` (already renamed for `layout`), run in `layout`'s working directory
/// with its inputs, the toolchain and the remote settings of `options`. So what `check` runs on a
/// worker is built exactly as a link's Actions are (salt, output fields, working directory,
/// environment, platform).
pub fn assemble(
    compiler: &str,
    arguments: Vec<String>,
    layout: &Layout,
    digests: &FileDigests,
    options: &ActionOptions,
) -> Result<Assembled, String> {
    let toolchain = &options.toolchain;
    let toolchain_inputs: Vec<(String, &ToolchainFile)> = toolchain
        .inputs()
        .into_iter()
        .map(|(path, file)| (layout.in_working_directory(&path), file))
        .collect();
    let mut blobs = Vec::with_capacity(layout.generated.len() + 4);
    let mut input_files = Vec::with_capacity(layout.inputs.len());
    let mut tree_entries =
        Vec::with_capacity(layout.inputs.len() + layout.generated.len() + toolchain_inputs.len());
    for (path, local) in &layout.inputs {
        let info = digests
            .get(local)
            .ok_or_else(|| format!("{} was not hashed", local.display()))?;
        tree_entries.push(TreeEntry {
            path,
            digest: &info.digest,
            executable: info.executable,
        });
        input_files.push(info.clone());
    }
    let mut rewritten_shard = None;
    for generated in &layout.generated {
        if generated.path == SHARD_NAME {
            rewritten_shard = Some(generated.digest.clone());
        }
        tree_entries.push(TreeEntry {
            path: &generated.path,
            digest: &generated.digest,
            executable: false,
        });
        blobs.push(Blob {
            digest: generated.digest.clone(),
            source: generated.source.clone(),
        });
    }
    for (path, file) in &toolchain_inputs {
        tree_entries.push(TreeEntry {
            path,
            digest: &file.digest,
            executable: file.executable,
        });
    }
    let tree = build_tree(tree_entries)?;

    let mut command_line = Vec::with_capacity(toolchain.launch().len().max(1) + arguments.len());
    if toolchain.launch().is_empty() {
        command_line.push(
            options
                .remote_compiler
                .clone()
                .unwrap_or_else(|| compiler.to_owned()),
        );
    } else {
        command_line.extend(toolchain.launch().iter().cloned());
    }
    command_line.extend(arguments);

    let platform = platform(&options.platform);

    let output_names: Vec<String> = layout
        .outputs
        .iter()
        .map(|(name, _)| name.clone())
        .collect();
    #[allow(deprecated)] // output_files is what servers below API 2.1 understand
    let command = Command {
        arguments: command_line,
        environment_variables: options.environment.to_command(),
        output_files: if options.legacy_output_files {
            output_names.clone()
        } else {
            Vec::new()
        },
        output_paths: if options.legacy_output_files {
            Vec::new()
        } else {
            output_names
        },
        working_directory: layout.working_directory.clone(),
        platform: platform.clone(),
        ..Default::default()
    };
    let (command_digest, command_bytes) = digest::of_message(&command);
    let action = Action {
        command_digest: Some(command_digest.clone()),
        input_root_digest: Some(tree.root_digest.clone()),
        platform,
        // In upload mode the input root holds the compiler; in worker mode only this says which
        // compiler the result came from.
        salt: match toolchain.identity.mode {
            ToolchainMode::Upload => Vec::new(),
            ToolchainMode::Worker => worker_salt(&toolchain.identity.digest),
        },
        ..Default::default()
    };
    let (action_digest, action_bytes) = digest::of_message(&action);
    let platform = action
        .platform
        .iter()
        .flat_map(|p| &p.properties)
        .map(|p| format!("{}={}", p.name, p.value))
        .collect();

    blobs.extend(tree.directories.into_iter().map(|(digest, bytes)| Blob {
        digest,
        source: BlobSource::Bytes(bytes.into()),
    }));
    blobs.push(Blob {
        digest: command_digest.clone(),
        source: BlobSource::Bytes(command_bytes.into()),
    });
    blobs.push(Blob {
        digest: action_digest.clone(),
        source: BlobSource::Bytes(action_bytes.into()),
    });
    Ok(Assembled {
        action_digest,
        command_digest,
        input_root: tree.root_digest,
        blobs,
        input_files,
        platform,
        rewritten_shard,
    })
}

/// The salt of worker-mode actions: the compiler's identity.
fn worker_salt(identity: &Digest) -> Vec<u8> {
    format!("dtlto-reapi compiler {}", digest::display(identity)).into_bytes()
}
