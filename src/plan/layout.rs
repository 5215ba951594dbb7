//! Where a job's files go inside its action's input root, and what its arguments call them.
//!
//! The *canonical* layout (the default) names every module after its content and rewrites the module
//! paths recorded in the index shard to match, so an action depends on content only: not on the
//! working directory, the checkout location, the linker's PID in archive-member names, or whether a
//! path was absolute. Shard entries are matched to input files by module hash, which also survives
//! LLVM 22.1.8's corruption of non-ASCII module paths inside shards. When a shard cannot be read or
//! fully matched, the job falls back to the mirror layout.
//!
//! The *mirror* layout keeps every module at its path relative to the link's working directory,
//! because the index shard records imported modules by exactly those paths and clang opens them
//! relative to its working directory. The input root is the deepest directory that holds the working
//! directory and every module, so nothing about where the checkout lives enters the action. What
//! changes from link to link — the shard's and the outputs' PID-based names — gets fixed names under
//! [`RESERVED_DIR`], and absolute paths that are not recorded in the shard (common inputs such as a
//! sample profile) are moved there too.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use super::digests::{FileDigests, FileInfo};
use super::options::LayoutKind;
use crate::bitcode;
use crate::cache::DigestCache;
use crate::jobs::{Job, JobFile};
use crate::reapi::digest::{self, Digest};
use crate::reapi::{BlobSource, Deferred};

/// The directory, inside the working directory, that holds the files given fixed names.
pub const RESERVED_DIR: &str = ".dtlto-reapi";

/// A job's files as its action sees them.
#[derive(Debug, Clone)]
pub struct Layout {
    pub kind: LayoutKind,
    /// The working directory's path inside the input root (`""` for the root itself).
    pub working_directory: String,
    /// `(path inside the input root, local file)` for every input taken as it is (shared: a
    /// canonical layout takes both from the link's [`FileInfo`]s).
    pub inputs: Vec<(Arc<str>, Arc<Path>)>,
    /// Inputs the layout produced (a rewritten shard).
    pub generated: Vec<Generated>,
    /// Argument renames: a path as the job file writes it → the path relative to the action's working
    /// directory.
    pub renames: HashMap<String, String>,
    /// `(path relative to the working directory, local path lld expects)` for every output.
    pub outputs: Vec<(String, PathBuf)>,
}

/// An input the layout made: its path inside the input root, its digest and its content (made now,
/// or when it must be uploaded).
#[derive(Debug, Clone)]
pub struct Generated {
    pub path: String,
    pub digest: Digest,
    pub source: BlobSource,
}

/// Why a job cannot run remotely in a layout (it then runs locally).
#[derive(Debug, Clone, PartialEq)]
pub struct NotRemotable {
    /// Groups jobs with the same problem into one warning.
    pub cause: &'static str,
    pub detail: String,
}

/// The mirror layout of `job`, for a link run in `cwd` (absolute).
pub fn mirror(job_file: &JobFile, job: &Job, cwd: &Path) -> Result<Layout, NotRemotable> {
    // Modules are recorded in the index shard by the paths the link used; absolute ones would have
    // to exist at the same absolute place on the worker.
    let modules: Vec<&Path> = std::iter::once(job.module())
        .chain(job.imports().iter().map(PathBuf::as_path))
        .collect();
    if let Some(absolute) = modules.iter().find(|p| p.is_absolute()) {
        return Err(NotRemotable {
            cause: "absolute-module-path",
            detail: format!(
                "module {} is named by an absolute path, which the index shard records and a remote worker \
                 cannot resolve in the mirror layout",
                absolute.display()
            ),
        });
    }
    let relative_common: Vec<&Path> = job_file
        .common_inputs
        .iter()
        .map(PathBuf::as_path)
        .filter(|p| p.is_relative())
        .collect();
    let mirrored: Vec<(&Path, PathBuf)> = modules
        .iter()
        .chain(&relative_common)
        .map(|p| (*p, normalize(&cwd.join(p))))
        .collect();

    let mut root = cwd.to_path_buf();
    for (_, absolute) in &mirrored {
        let parent = absolute.parent().unwrap_or(Path::new("/"));
        while !parent.starts_with(&root) {
            if !root.pop() {
                break;
            }
        }
    }
    // On Windows, a module on another drive or share than the working directory has no directory
    // in common with it: its path could not be mirrored.
    if let Some((path, _)) = mirrored.iter().find(|(_, p)| !p.starts_with(&root)) {
        return Err(NotRemotable {
            cause: "mirror-other-volume",
            detail: format!(
                "{} is on another drive or share than the working directory {}, which the mirror \
                 layout cannot place under one directory for a worker",
                path.display(),
                cwd.display()
            ),
        });
    }
    // Paths inside the input root are written with `/`, whatever separators the link used.
    let relative_to_root = |path: &Path| -> String {
        let rel = path.strip_prefix(&root).unwrap_or(path);
        rel.components()
            .map(|c| c.as_os_str().to_string_lossy())
            .collect::<Vec<_>>()
            .join("/")
    };
    let mut layout = Layout::new(LayoutKind::Mirror, relative_to_root(cwd));
    for (path, absolute) in &mirrored {
        layout
            .inputs
            .push((relative_to_root(absolute).into(), (*path).into()));
    }
    let shard = layout.in_working_directory(SHARD_NAME);
    layout.inputs.push((shard.into(), job.index_shard().into()));
    layout.rename(job.index_shard(), SHARD_NAME.to_owned());
    let absolute_common = job_file
        .common_inputs
        .iter()
        .enumerate()
        .filter(|(_, p)| p.is_absolute());
    layout.add_common_inputs(absolute_common);
    layout.add_outputs(job);
    Ok(layout)
}

/// The canonical layout of `job`: modules named by content at the root of the input root, the index
/// shard rewritten to those names, fixed names for everything else.
///
/// The rewrite's digest is remembered in `memo` (a derived digest of the digest cache), keyed by
/// everything the rewrite is a function of: the shard's digest, the job's modules (path and
/// digest, in job order) and [`REWRITE_VERSION`], in the slot of the job's module (see
/// [`rewrite_slot`]). When it is known, the shard is not even read: its rewrite is made only if the
/// action must be uploaded (a cache miss), and checked against that digest.
pub fn canonical(
    job_file: &JobFile,
    job: &Job,
    digests: &FileDigests,
    memo: &DigestCache,
) -> Result<Layout, NotRemotable> {
    let not_hashed = |path: &Path| NotRemotable {
        cause: "planning",
        detail: format!("{} was not hashed", path.display()),
    };
    let shard_digest = &digests
        .get(job.index_shard())
        .ok_or_else(|| not_hashed(job.index_shard()))?
        .digest;
    // The job's modules, each to be claimed by exactly one shard entry.
    let modules = &job.inputs[..];
    let mut infos: Vec<&FileInfo> = Vec::with_capacity(modules.len() - 1);
    for module in std::iter::once(job.module()).chain(job.imports().iter().map(PathBuf::as_path)) {
        infos.push(digests.get(module).ok_or_else(|| not_hashed(module))?);
    }
    let names = content_names(&infos);
    let hashes: Vec<Option<[u32; 5]>> = infos.iter().map(|info| info.module_hash).collect();
    let key = rewrite_key(shard_digest, job, &infos);
    let slot = rewrite_slot(job, infos[0]);

    let mut layout = Layout::new(LayoutKind::Canonical, String::new());
    layout
        .inputs
        .reserve(infos.len() + job_file.common_inputs.len());
    for (name, info) in names.iter().zip(&infos) {
        layout.inputs.push((name.clone(), info.local.clone()));
    }
    layout.rename(job.module(), names[0].to_string());
    let shard = match memo.derived(&slot, &key) {
        Some(digest) => {
            let inputs = job.inputs.clone();
            let expected = digest.clone();
            let make = move || {
                let shard_path = &inputs[1];
                let bytes = std::fs::read(shard_path).map_err(|e| {
                    format!("cannot read the index shard {}: {e}", shard_path.display())
                })?;
                let rewritten = rewrite(&bytes, shard_path, &module_list(&inputs), &hashes, &names)
                    .map_err(|e| e.detail)?;
                if digest::of_bytes(&rewritten) != expected {
                    return Err(format!(
                        "the index shard {} rewrote to other content than the digest cache \
                         remembers",
                        shard_path.display()
                    ));
                }
                Ok(rewritten)
            };
            Generated {
                path: SHARD_NAME.to_owned(),
                digest,
                source: BlobSource::Deferred(Deferred(Arc::new(make))),
            }
        }
        None => {
            let shard_path = job.index_shard();
            let bytes =
                std::fs::read(shard_path).map_err(|e| unreadable(shard_path, e.to_string()))?;
            // The key names the content that was hashed: what is rewritten must be that.
            if digest::of_bytes(&bytes) != *shard_digest {
                return Err(unreadable(
                    shard_path,
                    "it changed while the link ran".to_owned(),
                ));
            }
            let rewritten = rewrite(&bytes, shard_path, &module_list(modules), &hashes, &names)?;
            let digest = digest::of_bytes(&rewritten);
            memo.remember_derived(slot, key, digest.clone());
            Generated {
                path: SHARD_NAME.to_owned(),
                digest,
                source: BlobSource::Bytes(rewritten.into()),
            }
        }
    };
    layout.generated.push(shard);
    layout.rename(job.index_shard(), SHARD_NAME.to_owned());
    layout.add_common_inputs(job_file.common_inputs.iter().enumerate());
    layout.add_outputs(job);
    Ok(layout)
}

/// The modules of a job's `inputs` (the module, then its imports; not the index shard).
fn module_list(inputs: &[PathBuf]) -> Vec<&Path> {
    std::iter::once(&inputs[0])
        .chain(&inputs[2..])
        .map(PathBuf::as_path)
        .collect()
}

/// Names the shard rewrite's output differently whenever the rewrite changes what it makes for the
/// same inputs, so that no remembered digest outlives the code that made it.
const REWRITE_VERSION: &str = "dtlto-reapi shard rewrite 1";

/// The memo key of a shard rewrite: a SHA-256 of its version, the shard's digest and the job's
/// modules (path and digest, `infos` in the order of `job`'s module and imports).
fn rewrite_key(shard: &Digest, job: &Job, infos: &[&FileInfo]) -> String {
    use sha2::Digest as _;
    // Gathered first and hashed in one call: ~340 fields of a few dozen bytes each, fed one by
    // one, spent more time in the hasher's buffering than in hashing.
    let mut fields = Vec::with_capacity(256 + infos.len() * 160);
    let mut field = |bytes: &[u8]| {
        fields.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        fields.extend_from_slice(bytes);
    };
    field(REWRITE_VERSION.as_bytes());
    field(b"shard digest");
    field(shard.hash.as_bytes());
    field(&shard.size_bytes.to_le_bytes());
    let modules = std::iter::once(job.module()).chain(job.imports().iter().map(PathBuf::as_path));
    for (module, info) in modules.zip(infos) {
        field(module.as_os_str().as_encoded_bytes());
        field(info.digest.hash.as_bytes());
        field(&info.digest.size_bytes.to_le_bytes());
    }
    hex::encode(sha2::Sha256::digest(&fields))
}

/// The digest cache slot of a job's rewritten index shard: its module, by the path the job names
/// it by and its content. An edit that changes what the shard is rewritten from (an imported
/// module, the shard itself) replaces the slot's entry at the next relink instead of adding one.
/// The link's directory is not part of it: a build directory made anew (or a second checkout)
/// whose link names the same modules finds the rewrites already made, as the key matches.
fn rewrite_slot(job: &Job, module: &FileInfo) -> String {
    use sha2::Digest as _;
    let mut hasher = sha2::Sha256::new();
    let mut field = |bytes: &[u8]| {
        hasher.update((bytes.len() as u64).to_le_bytes());
        hasher.update(bytes);
    };
    field(b"rewritten index shard of the module");
    field(job.module().as_os_str().as_encoded_bytes());
    field(module.digest.hash.as_bytes());
    hex::encode(hasher.finalize())
}

fn unreadable(shard: &Path, what: String) -> NotRemotable {
    NotRemotable {
        cause: "canonical-shard-unreadable",
        detail: format!("cannot read the index shard {}: {what}", shard.display()),
    }
}

/// Content-derived names; identical files at different paths get a suffix. The job's own module
/// is named first, so it always gets the plain name; which of its identical twins gets which
/// suffix cannot matter, as they have the same content.
fn content_names(infos: &[&FileInfo]) -> Vec<Arc<str>> {
    let mut names: Vec<Arc<str>> = infos.iter().map(|info| info.content_name.clone()).collect();
    if !infos.iter().any(|info| info.has_twin) {
        return names;
    }
    // Twins are rare: find them by sorting by content, in job order among equals.
    let hash = |i: usize| infos[i].digest.hash.as_str();
    let mut order: Vec<usize> = (0..infos.len()).collect();
    order.sort_unstable_by(|&a, &b| (hash(a), a).cmp(&(hash(b), b)));
    let mut twin = 0;
    for pair in order.windows(2) {
        if hash(pair[0]) == hash(pair[1]) {
            twin += 1;
            names[pair[1]] = format!("{}-{twin}.o", hash(pair[1])).into();
        } else {
            twin = 0;
        }
    }
    names
}

/// The index shard `bytes` (read from `shard_path`) with its module entries matched to `modules`
/// (whose module hashes are `hashes`) and renamed to their `names`.
fn rewrite(
    bytes: &[u8],
    shard_path: &Path,
    modules: &[&Path],
    hashes: &[Option<[u32; 5]>],
    names: &[Arc<str>],
) -> Result<Vec<u8>, NotRemotable> {
    let unreadable = |what: String| unreadable(shard_path, what);
    // Read once, for matching and for the rewrite.
    let shard = bitcode::ReadShard::new(bytes).map_err(|e| unreadable(e.to_string()))?;
    let entries = shard.modules();
    // The modules sorted by the last four words of their hash, in job order among equals:
    // `matches_hash`, not equality, because LLVM 22.1.8 corrupts the first word along with a
    // non-ASCII path. One sorted list, not a map of lists: no allocation per module.
    let mut by_hash: Vec<([u32; 4], usize)> = hashes
        .iter()
        .enumerate()
        .filter_map(|(i, hash)| hash.map(|[_, rest @ ..]| (rest, i)))
        .collect();
    by_hash.sort_unstable();
    let mut claimed = vec![false; modules.len()];
    let mut matched: Vec<usize> = Vec::with_capacity(entries.len());
    for entry in entries {
        let with_hash = |rest: [u32; 4]| {
            let first = by_hash.partition_point(|&(h, _)| h < rest);
            by_hash[first..]
                .iter()
                .take_while(|&&(h, _)| h == rest)
                .map(|&(_, i)| i)
                .find(|&i| !claimed[i] && hashes[i].is_some_and(|h| entry.matches_hash(&h)))
        };
        let by_path = |i: usize| modules[i].as_os_str().as_encoded_bytes() == entry.path.as_slice();
        let found = entry
            .hash
            .and_then(|[_, rest @ ..]| with_hash(rest))
            .or_else(|| (0..modules.len()).find(|&i| !claimed[i] && by_path(i)));
        let Some(i) = found else {
            return Err(NotRemotable {
                cause: "canonical-unmatched-module",
                detail: format!(
                    "module {:?} recorded in the index shard {} matches none of the job's input files",
                    String::from_utf8_lossy(&entry.path),
                    shard_path.display()
                ),
            });
        };
        claimed[i] = true;
        matched.push(i);
    }
    if !claimed[0] {
        return Err(NotRemotable {
            cause: "canonical-unmatched-module",
            detail: format!(
                "the index shard {} does not record the job's own module",
                shard_path.display()
            ),
        });
    }
    let mut next = matched.iter();
    shard
        .canonicalize(|_| next.next().map_or(&[][..], |&i| names[i].as_bytes()))
        .map_err(|e| unreadable(e.to_string()))
}

/// The fixed name of the index shard, relative to the working directory.
pub(crate) const SHARD_NAME: &str = ".dtlto-reapi/index.thinlto.bc";

impl Layout {
    /// The layout of a command without files of its own (`check`'s probe): the input root holds
    /// only the toolchain, and is the working directory.
    pub fn bare(kind: LayoutKind) -> Layout {
        Layout::new(kind, String::new())
    }

    fn new(kind: LayoutKind, working_directory: String) -> Layout {
        Layout {
            kind,
            working_directory,
            inputs: Vec::new(),
            generated: Vec::new(),
            renames: HashMap::new(),
            outputs: Vec::new(),
        }
    }

    /// `name` (relative to the working directory) as a path inside the input root.
    pub fn in_working_directory(&self, name: &str) -> String {
        if self.working_directory.is_empty() {
            name.to_owned()
        } else {
            format!("{}/{name}", self.working_directory)
        }
    }

    fn rename(&mut self, local: &Path, name: String) {
        self.renames
            .insert(local.to_string_lossy().into_owned(), name);
    }

    /// Common inputs (numbered by their place in `common.inputs`) under fixed names.
    fn add_common_inputs<'a>(&mut self, common: impl Iterator<Item = (usize, &'a PathBuf)>) {
        for (i, path) in common {
            let file_name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let name = format!("{RESERVED_DIR}/common-{i}/{file_name}");
            self.inputs.push((
                self.in_working_directory(&name).into(),
                path.as_path().into(),
            ));
            self.rename(path, name);
        }
    }

    /// Outputs under fixed names, so the PID in lld's names stays out of the action.
    fn add_outputs(&mut self, job: &Job) {
        for (k, local) in job.outputs.iter().enumerate() {
            let name = format!("{RESERVED_DIR}/out-{k}");
            self.rename(local, name.clone());
            self.outputs.push((name, local.clone()));
        }
    }
}

/// Resolves `.` and `..` lexically (the job file's paths are lexical; the worker sees no symlinks).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job_file(inputs: &[&str], common: &[&str]) -> JobFile {
        JobFile {
            path: "l.json".into(),
            common_args: vec!["clang".into()],
            common_inputs: common.iter().map(PathBuf::from).collect(),
            jobs: vec![Job {
                index: 0,
                args: vec![].into(),
                inputs: inputs.iter().map(PathBuf::from).collect(),
                outputs: vec!["out/t1.1.77.native.o".into()].into(),
            }],
        }
    }

    #[test]
    fn root_is_the_deepest_directory_holding_everything() {
        let file = job_file(
            &["t1.o", "out/t1.1.77.native.o.thinlto.bc", "../lib/t2.o"],
            &["prof.afdo"],
        );
        let layout = mirror(&file, &file.jobs[0], Path::new("/home/u/proj/build")).unwrap();
        assert_eq!(layout.working_directory, "build");
        let inputs: Vec<&str> = layout.inputs.iter().map(|(p, _)| &**p).collect();
        assert_eq!(
            inputs,
            [
                "build/t1.o",
                "lib/t2.o",
                "build/prof.afdo",
                "build/.dtlto-reapi/index.thinlto.bc"
            ]
        );
        assert_eq!(
            layout.renames["out/t1.1.77.native.o.thinlto.bc"],
            ".dtlto-reapi/index.thinlto.bc"
        );
        assert_eq!(
            layout.outputs,
            [(
                ".dtlto-reapi/out-0".to_owned(),
                PathBuf::from("out/t1.1.77.native.o")
            )]
        );
    }

    #[test]
    fn the_same_link_elsewhere_has_the_same_layout() {
        let file = job_file(&["t1.o", "t1.1.77.native.o.thinlto.bc", "t2.o"], &[]);
        let a = mirror(&file, &file.jobs[0], Path::new("/home/u/proj")).unwrap();
        let b = mirror(&file, &file.jobs[0], Path::new("/tmp/other (copy)/x")).unwrap();
        assert_eq!(a.working_directory, "");
        assert_eq!(
            a.inputs.iter().map(|i| &i.0).collect::<Vec<_>>(),
            b.inputs.iter().map(|i| &i.0).collect::<Vec<_>>()
        );
    }

    #[test]
    fn absolute_modules_are_not_remotable_but_absolute_common_inputs_move() {
        let file = job_file(&["t1.o", "s.bc", "/abs/t2.o"], &[]);
        let err = mirror(&file, &file.jobs[0], Path::new("/w")).unwrap_err();
        assert_eq!(err.cause, "absolute-module-path");
        assert!(err.detail.contains("/abs/t2.o"));

        let file = job_file(&["t1.o", "s.bc"], &["/opt/prof.afdo"]);
        let layout = mirror(&file, &file.jobs[0], Path::new("/w")).unwrap();
        assert_eq!(
            layout.renames["/opt/prof.afdo"],
            ".dtlto-reapi/common-0/prof.afdo"
        );
    }

    /// Writes the modules and the index shard of `t1.o`'s job in a real COFF link (lld-link 22.1.8:
    /// `t1.o` imports from `t2.o` and from the member `t3.o` of `libt3.lib`) into `dir`, the member
    /// under the name lld-link gave it, and plans the job's canonical layout.
    fn coff_canonical_layout(
        dir: &Path,
        shard: &[u8],
        member: &str,
        pid: u32,
    ) -> (Layout, JobFile, FileDigests) {
        let testdata = |name: &str| -> Vec<u8> {
            let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/bitcode/testdata");
            std::fs::read(path.join(name)).unwrap()
        };
        let native = format!("t1.1.{pid}.native.o");
        let files = [
            ("t1.o".to_owned(), testdata("coff-t1.o")),
            (format!("{native}.thinlto.bc"), shard.to_vec()),
            (member.to_owned(), testdata("coff-libt3-member.o")),
            ("t2.o".to_owned(), testdata("coff-t2.o")),
        ];
        let mut inputs = Vec::new();
        for (name, content) in files {
            let path = dir.join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, content).unwrap();
            inputs.push(path);
        }
        let output = dir.join(native);
        let path_arg = |p: &Path| p.to_string_lossy().into_owned();
        let args = vec![
            "-c".to_owned(),
            format!("-fthinlto-index={}", path_arg(&inputs[1])),
            "-o".to_owned(),
            path_arg(&output),
            "-x".to_owned(),
            "ir".to_owned(),
            path_arg(&inputs[0]),
        ];
        let file = JobFile {
            path: "a.json".into(),
            common_args: vec!["zig".into(), "clang".into(), "-O2".into()],
            common_inputs: vec![],
            jobs: vec![Job {
                index: 0,
                args: args.into(),
                inputs: inputs.into(),
                outputs: vec![output].into(),
            }],
        };
        let job = &file.jobs[0];
        let digests = FileDigests::compute(
            job.inputs.iter().map(PathBuf::as_path),
            1,
            &crate::cache::DigestCache::open(None),
        )
        .unwrap();
        let layout = canonical(&file, job, &digests, &DigestCache::open(None)).unwrap();
        (layout, file, digests)
    }

    #[test]
    fn coff_archive_members_get_the_same_canonical_layout_in_every_link() {
        // Two links of the same objects: the member's name carries lld-link's PID, and the second
        // link's output (and so the member) is in a subdirectory.
        let dir = tempfile::tempdir().unwrap();
        let first = coff_canonical_layout(
            &dir.path().join("one"),
            include_bytes!("../bitcode/testdata/coff-t1.thinlto.bc"),
            "libt3.libt3.o158.3.453F.o",
            17727,
        )
        .0;
        let second = coff_canonical_layout(
            &dir.path().join("two"),
            include_bytes!("../bitcode/testdata/coff-t1.relink.thinlto.bc"),
            "again/libt3.libt3.o158.3.4574.o",
            17780,
        )
        .0;
        assert_eq!(first.kind, LayoutKind::Canonical);
        let names = |layout: &Layout| -> Vec<String> {
            layout
                .inputs
                .iter()
                .map(|(name, _)| name.to_string())
                .collect()
        };
        assert_eq!(names(&first), names(&second));
        assert_eq!(first.generated[0].digest, second.generated[0].digest);
        assert!(
            names(&first)
                .iter()
                .all(|n| n.len() == 66 && n.ends_with(".o")),
            "{:?}",
            names(&first)
        );
    }

    #[test]
    fn identical_modules_get_numbered_names_in_job_order() {
        let info = |content: &[u8], path: &str| {
            let digest = digest::of_bytes(content);
            FileInfo {
                local: Path::new(path).into(),
                content_name: format!("{}.o", digest.hash).into(),
                has_twin: true,
                part: Arc::new(super::super::digests::InputPart {
                    path: path.into(),
                    digest: String::new(),
                }),
                digest,
                executable: false,
                module_hash: None,
            }
        };
        let files = [
            info(b"a", "m.o"),
            info(b"b", "x.o"),
            info(b"a", "y.o"),
            info(b"c", "z.o"),
            info(b"a", "w.o"),
        ];
        let infos: Vec<&FileInfo> = files.iter().collect();
        let (a, b, c) = (
            digest::of_bytes(b"a").hash,
            digest::of_bytes(b"b").hash,
            digest::of_bytes(b"c").hash,
        );
        let names: Vec<String> = content_names(&infos)
            .iter()
            .map(|n| n.to_string())
            .collect();
        assert_eq!(
            names,
            [
                format!("{a}.o"),
                format!("{b}.o"),
                format!("{a}-1.o"),
                format!("{c}.o"),
                format!("{a}-2.o")
            ]
        );
    }

    #[test]
    fn a_remembered_rewrite_is_not_redone_and_its_bytes_are_made_on_demand() {
        let dir = tempfile::tempdir().unwrap();
        let (first, file, digests) = coff_canonical_layout(
            &dir.path().join("link"),
            include_bytes!("../bitcode/testdata/coff-t1.thinlto.bc"),
            "libt3.libt3.o158.3.453F.o",
            17727,
        );
        let memo = DigestCache::open(None);
        let job = &file.jobs[0];
        let made = canonical(&file, job, &digests, &memo).unwrap();
        let remembered = canonical(&file, job, &digests, &memo).unwrap();
        let (made, remembered) = (&made.generated[0], &remembered.generated[0]);
        assert_eq!(made.digest, first.generated[0].digest);
        assert_eq!(remembered.digest, made.digest);
        let (BlobSource::Bytes(bytes), BlobSource::Deferred(deferred)) =
            (&made.source, &remembered.source)
        else {
            panic!("{made:?} {remembered:?}");
        };
        assert_eq!(&deferred.make(&made.digest).unwrap(), bytes);

        // A digest remembered wrongly is caught when the bytes are made, never uploaded.
        let shard = &digests.get(job.index_shard()).unwrap().digest;
        let infos: Vec<&FileInfo> = module_list(&job.inputs)
            .into_iter()
            .map(|m| &**digests.get(m).unwrap())
            .collect();
        let wrong = DigestCache::open(None);
        let other = digest::of_bytes(b"something else");
        let slot = rewrite_slot(job, infos[0]);
        wrong.remember_derived(slot, rewrite_key(shard, job, &infos), other.clone());
        let layout = canonical(&file, job, &digests, &wrong).unwrap();
        let BlobSource::Deferred(deferred) = &layout.generated[0].source else {
            panic!("not deferred");
        };
        let err = deferred.make(&other).unwrap_err().to_string();
        assert!(err.contains("other content"), "{err}");
    }

    /// The Action digest of a fixed job is pinned: a change to planning (layout, shard rewrite, input
    /// tree, Command, Action) that changes any key fails here, so that speed-ups provably keep every
    /// cache entry valid. If a key must change on purpose, say so in the commit and update the pin.
    #[test]
    fn the_action_digest_of_a_fixed_job_is_pinned() {
        // The same job wherever its files are, and however the link spells their paths: lld-link on
        // Windows writes them with mixed separators (`Z:\tmp\x/t1.1.17727.native.o.thinlto.bc`), here
        // a directory of that name.
        for link_dir in ["link", "Z:\\tmp\\x"] {
            assert_eq!(
                pinned_job_digest(link_dir),
                "5158867915cebea58d25fe4759a96c0d92f1281d32c4739a5fcf1a4ef49eb8bd/253",
                "{link_dir}"
            );
        }
    }

    /// The Action digest of `t1.o`'s job of [`coff_canonical_layout`], its files in `link_dir`.
    fn pinned_job_digest(link_dir: &str) -> String {
        use super::super::action::{ActionOptions, build};
        use super::super::options::ToolchainMode;
        use super::super::toolchain::{ModeRequest, Toolchain};
        let dir = tempfile::tempdir().unwrap();
        let (layout, file, digests) = coff_canonical_layout(
            &dir.path().join(link_dir),
            include_bytes!("../bitcode/testdata/coff-t1.thinlto.bc"),
            "libt3.libt3.o158.3.453F.o",
            17727,
        );
        // A compiler of fixed content, in worker mode (named on the workers by --remote-compiler).
        let compiler = dir.path().join("clang");
        std::fs::write(&compiler, "#!/bin/sh\nexec zig clang \"$@\"\n").unwrap();
        let common_args = [compiler.to_string_lossy().into_owned()];
        let request = ModeRequest {
            toolchain: Some(ToolchainMode::Worker),
            remote_compiler: Some("/usr/bin/clang"),
            upload_compiler: None,
        };
        let cache = crate::cache::DigestCache::open(None);
        let environment = super::super::environment::Environment::new(&[]).unwrap();
        let (toolchain, _) =
            Toolchain::resolve(&common_args, request, &environment, &cache).unwrap();
        let options = ActionOptions {
            toolchain: std::sync::Arc::new(toolchain),
            toolchain_blobs: std::sync::Arc::new([]),
            remote_compiler: Some("/usr/bin/clang".to_owned()),
            platform: vec![("OSFamily".to_owned(), "linux".to_owned())],
            environment: std::sync::Arc::new(environment),
            legacy_output_files: false,
        };
        let spec = build(&file, &file.jobs[0], layout, &digests, &options).unwrap();
        crate::reapi::digest::display(&spec.action_digest).to_string()
    }

    proptest::proptest! {
        /// Whatever paths a job file names (absolute, `..` beyond the root, `.`, spaces, Unicode),
        /// planning gives a layout or a reason, and the layout gives an input tree or an error:
        /// never a panic.
        #[test]
        fn arbitrary_paths_never_panic(
            inputs in proptest::collection::vec("(/|\\.\\./|\\./|[a-z (α]{1,4}/){0,4}[a-z. ()α]{0,6}", 2..6),
            common in proptest::collection::vec("(/|\\.\\./)?[a-z (]{1,4}", 0..2),
            cwd in "(/[a-z (α]{1,4}){0,3}",
        ) {
            let inputs: Vec<&str> = inputs.iter().map(String::as_str).collect();
            let common: Vec<&str> = common.iter().map(String::as_str).collect();
            let file = job_file(&inputs, &common);
            let cwd = if cwd.is_empty() { "/".to_owned() } else { cwd };
            if let Ok(layout) = mirror(&file, &file.jobs[0], Path::new(&cwd)) {
                let digests: Vec<_> = layout
                    .inputs
                    .iter()
                    .map(|(path, _)| crate::reapi::digest::of_bytes(path.as_bytes()))
                    .collect();
                let entries = layout.inputs.iter().zip(&digests).map(|((path, _), digest)| {
                    super::super::merkle::TreeEntry { path, digest, executable: false }
                });
                let _ = super::super::merkle::build_tree(entries.collect());
            }
        }
    }
}
