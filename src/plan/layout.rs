//! Where a job's files go inside its action's input root, and what its arguments call them.
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

use crate::jobs::{Job, JobFile};

/// The directory, inside the working directory, that holds the files given fixed names.
pub const RESERVED_DIR: &str = ".dtlto-reapi";

/// Which layout a job's action uses.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum LayoutKind {
    Mirror,
}

/// A job's files as its action sees them.
#[derive(Debug, Clone)]
pub struct Layout {
    pub kind: LayoutKind,
    /// The working directory's path inside the input root (`""` for the root itself).
    pub working_directory: String,
    /// `(path inside the input root, local file)` for every input.
    pub inputs: Vec<(String, PathBuf)>,
    /// Argument renames: a path as the job file writes it → the path relative to the action's working
    /// directory.
    pub renames: HashMap<String, String>,
    /// `(path relative to the working directory, local path lld expects)` for every output.
    pub outputs: Vec<(String, PathBuf)>,
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
    let relative_to_root = |path: &Path| -> String {
        let rel = path.strip_prefix(&root).unwrap_or(path);
        rel.components()
            .map(|c| c.as_os_str().to_string_lossy())
            .collect::<Vec<_>>()
            .join("/")
    };
    let working_directory = relative_to_root(cwd);
    let in_wd = |name: &str| -> String {
        if working_directory.is_empty() {
            name.to_owned()
        } else {
            format!("{working_directory}/{name}")
        }
    };

    let mut inputs: Vec<(String, PathBuf)> = mirrored
        .iter()
        .map(|(p, abs)| (relative_to_root(abs), p.to_path_buf()))
        .collect();
    let mut renames = HashMap::new();

    let shard = format!("{RESERVED_DIR}/index.thinlto.bc");
    inputs.push((in_wd(&shard), job.index_shard().to_owned()));
    renames.insert(job.index_shard().to_string_lossy().into_owned(), shard);

    for (i, common) in job_file
        .common_inputs
        .iter()
        .enumerate()
        .filter(|(_, p)| p.is_absolute())
    {
        let name = common
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let relocated = format!("{RESERVED_DIR}/common-{i}/{name}");
        inputs.push((in_wd(&relocated), common.clone()));
        renames.insert(common.to_string_lossy().into_owned(), relocated);
    }

    let outputs = job
        .outputs
        .iter()
        .enumerate()
        .map(|(k, local)| {
            let name = format!("{RESERVED_DIR}/out-{k}");
            renames.insert(local.to_string_lossy().into_owned(), name.clone());
            (name, local.clone())
        })
        .collect();

    Ok(Layout {
        kind: LayoutKind::Mirror,
        working_directory,
        inputs,
        renames,
        outputs,
    })
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
            linker_output: "a.out".into(),
            common_args: vec!["clang".into()],
            common_inputs: common.iter().map(PathBuf::from).collect(),
            jobs: vec![Job {
                index: 0,
                args: vec![],
                inputs: inputs.iter().map(PathBuf::from).collect(),
                outputs: vec!["out/t1.1.77.native.o".into()],
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
        let inputs: Vec<&str> = layout.inputs.iter().map(|(p, _)| p.as_str()).collect();
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
}
