//! Outputs are never half-written: every file a job produces is first written under a temporary name
//! beside its final path and renamed into place only once the whole job has succeeded.
//!
//! lld links whatever it finds at a job's output paths, so a truncated object from an interrupted
//! compile or download would be a silent miscompile. [`StagedOutputs`] owns the temporary names: a job
//! that fails, is cancelled or panics drops them and leaves nothing behind, and [`StagedOutputs::commit`]
//! checks that every listed output was produced before moving any of them.
//!
//! The temporary names are random (so that neither another link in the same
//! directory nor anyone planting files there can predict them) and carry the process id, so that
//! the names a killed run left behind are recognised and removed by the next run
//! ([`remove_leftovers`]) while those of runs still going are left alone.

use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};

use crate::jobs::Job;

/// The temporary names of one job's outputs.
#[derive(Debug)]
pub struct StagedOutputs {
    /// `(final path, staged path)` in the job's output order.
    pairs: Vec<(PathBuf, PathBuf)>,
    committed: bool,
}

impl StagedOutputs {
    /// Chooses a hidden temporary name beside each of `job`'s outputs (same directory, so the final
    /// rename is atomic): `.<name>.dtlto-<pid>-<random>.tmp`, with 64 random bits. Nothing is
    /// created: whatever writes the output creates the file, so a job that writes nothing is
    /// noticed, and a cached relink allocates one inode per output, not three file operations
    /// (on ext4, allocating inodes in a directory whose files were just deleted is most of the
    /// kernel's time in such a link).
    pub fn new(job: &Job) -> io::Result<StagedOutputs> {
        let pid = std::process::id();
        let mut staged = StagedOutputs {
            pairs: Vec::with_capacity(job.outputs.len()),
            committed: false,
        };
        for output in job.outputs.iter() {
            let name = output
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let random: u64 = rand::random();
            let path =
                directory_of(output).join(format!(".{name}{MARKER}{pid}-{random:016x}{SUFFIX}"));
            staged.pairs.push((output.clone(), path));
        }
        Ok(staged)
    }

    /// `(final path, staged path)` pairs.
    pub fn pairs(&self) -> impl Iterator<Item = (&Path, &Path)> {
        self.pairs.iter().map(|(f, s)| (f.as_path(), s.as_path()))
    }

    /// The staged path of a final output path, if it is one of this job's outputs.
    pub fn staged_path_of(&self, output: &Path) -> Option<&Path> {
        self.pairs().find(|(f, _)| *f == output).map(|(_, s)| s)
    }

    /// Moves every staged file into place. Fails, leaving no output of the job behind, when one is
    /// missing, the native object (the first output) is empty, or one cannot be moved.
    pub fn commit(mut self) -> io::Result<()> {
        for (k, (output, staged)) in self.pairs.iter().enumerate() {
            let size = std::fs::metadata(staged)
                .ok()
                .filter(|m| m.is_file())
                .map(|m| m.len());
            match size {
                None => {
                    return Err(io::Error::new(
                        io::ErrorKind::NotFound,
                        format!("the job did not produce its output {}", output.display()),
                    ));
                }
                // clang's ThinLTO backend exits 0 with an empty object when it cannot load an
                // imported module; lld would then fail far from the cause.
                Some(0) if k == 0 => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "the compiler produced an empty native object {}",
                            output.display()
                        ),
                    ));
                }
                Some(_) => {}
            }
        }
        for (done, (output, staged)) in self.pairs.iter().enumerate() {
            if let Err(e) = std::fs::rename(staged, output) {
                for (placed, _) in &self.pairs[..done] {
                    let _ = std::fs::remove_file(placed);
                }
                return Err(io::Error::new(
                    e.kind(),
                    format!("cannot move {} into place: {e}", output.display()),
                ));
            }
        }
        self.committed = true;
        Ok(())
    }
}

impl Drop for StagedOutputs {
    fn drop(&mut self) {
        if !self.committed {
            for (_, staged) in &self.pairs {
                let _ = std::fs::remove_file(staged);
            }
        }
    }
}

/// The directory a file is in (`.` for a bare file name).
fn directory_of(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// What every staged name carries before the process id, and what it ends with.
const MARKER: &str = ".dtlto-";
const SUFFIX: &str = ".tmp";

/// Removes the staged files that runs no longer alive left in the directories of `outputs` (a run killed with SIGKILL, or that exited at a second Ctrl-C). Best effort: what cannot
/// be listed or removed stays.
pub fn remove_leftovers(outputs: &[&Path]) {
    let dirs: BTreeSet<&Path> = outputs.iter().map(|output| directory_of(output)).collect();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let dead = staging_pid(&name.to_string_lossy())
                .is_some_and(|pid| !crate::platform::is_alive(pid));
            if dead && entry.file_type().is_ok_and(|t| t.is_file()) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

/// The process id in a staged name `.<name>.dtlto-<pid>-<random>.tmp`.
fn staging_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix('.')?.strip_suffix(SUFFIX)?;
    let (_, tail) = rest.rsplit_once(MARKER)?;
    let (pid, random) = tail.split_once('-')?;
    if random.is_empty() || !random.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return None;
    }
    pid.parse().ok().filter(|pid| *pid > 0)
}

/// Writes `bytes` to `path` atomically (temporary file in the same directory, then rename), for files
/// the distributor itself produces, such as `--stats-json`.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_atomically_with(path, |out| out.write_all(bytes))
}

/// Like [`write_atomically`], with the content streamed by `write` (a 50,000-job `--stats-json` is
/// hundreds of MB: never held in memory whole).
pub fn write_atomically_with(
    path: &Path,
    write: impl FnOnce(&mut dyn io::Write) -> io::Result<()>,
) -> io::Result<()> {
    let dir = directory_of(path);
    let mut out = io::BufWriter::new(tempfile::NamedTempFile::new_in(dir)?);
    write(&mut out)?;
    let tmp = out.into_inner().map_err(|e| e.into_error())?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(dir: &Path) -> Job {
        Job {
            index: 3,
            args: vec![].into(),
            inputs: vec![dir.join("m.o"), dir.join("m.bc")].into(),
            outputs: vec![dir.join("m.native.o"), dir.join("m.stats")].into(),
        }
    }

    #[test]
    fn commit_moves_everything_into_place() {
        let dir = tempfile::tempdir().unwrap();
        let staged = StagedOutputs::new(&job(dir.path())).unwrap();
        for (_, s) in staged.pairs() {
            std::fs::write(s, b"obj").unwrap();
        }
        staged.commit().unwrap();
        assert_eq!(
            std::fs::read(dir.path().join("m.native.o")).unwrap(),
            b"obj"
        );
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    #[test]
    fn a_missing_output_fails_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let staged = StagedOutputs::new(&job(dir.path())).unwrap();
        let (_, first) = staged.pairs().next().unwrap();
        std::fs::write(first, b"half").unwrap();
        let err = staged.commit().unwrap_err();
        assert!(err.to_string().contains("m.stats"), "{err}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn an_empty_native_object_is_a_failure() {
        let dir = tempfile::tempdir().unwrap();
        let staged = StagedOutputs::new(&job(dir.path())).unwrap();
        let staged_paths: Vec<PathBuf> = staged.pairs().map(|(_, s)| s.to_owned()).collect();
        std::fs::write(&staged_paths[0], b"").unwrap();
        std::fs::write(&staged_paths[1], b"stats").unwrap();
        let err = staged.commit().unwrap_err();
        assert!(err.to_string().contains("empty native object"), "{err}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn dropping_removes_staged_files() {
        let dir = tempfile::tempdir().unwrap();
        let staged = StagedOutputs::new(&job(dir.path())).unwrap();
        for (_, s) in staged.pairs() {
            std::fs::write(s, b"partial").unwrap();
        }
        drop(staged);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn leftovers_of_dead_runs_go_and_live_ones_stay() {
        let dir = tempfile::tempdir().unwrap();
        let staged = StagedOutputs::new(&job(dir.path())).unwrap();
        let (_, live) = staged.pairs().next().unwrap();
        std::fs::write(live, b"being written").unwrap();
        // No process has pid i32::MAX (pids stay below 2^22).
        let dead = dir
            .path()
            .join(format!(".m.native.o.dtlto-{}-Ab12Cd.tmp", i32::MAX));
        std::fs::write(&dead, b"left by a killed run").unwrap();
        let unrelated = dir.path().join(".m.native.o.dtlto-notapid.tmp");
        std::fs::write(&unrelated, b"not ours").unwrap();
        let output = dir.path().join("m.native.o");
        remove_leftovers(&[&output]);
        assert!(live.exists());
        assert!(!dead.exists());
        assert!(unrelated.exists());
        assert_eq!(staging_pid(".a b.o.dtlto-x.dtlto-42-Zz9.tmp"), Some(42));
        assert_eq!(staging_pid("a.o.dtlto-42-Zz9.tmp"), None);
    }

    #[test]
    fn atomic_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stats.json");
        write_atomically(&path, b"{}").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"{}");
    }
}
