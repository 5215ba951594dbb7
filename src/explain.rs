//! `dtlto-reapi explain OLD.json NEW.json`: why the jobs of a link missed the cache, from two links'
//! `--stats-json`.
//!
//! Every job with an Action records the parts its digest is made of (`ActionParts`). For each job
//! of NEW that did not come from a cache, the job of OLD with the same module is found — by the
//! module's content, else by its path (archive members' temporary names compared without lld's
//! task and PID suffix) — and the parts that differ are named: the module itself, an imported
//! module, the index shard only (a summary change elsewhere in the program), the flags (which),
//! the compiler, the platform.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;

use crate::plan::digests::InputPart;
use crate::stats::{JobRecord, Ran, StatsFile};
use anyhow::{Context, Result};

fn label(job: &JobRecord) -> String {
    format!("job {} ({})", job.index, job.module.display())
}

/// Whether the job's result came from a cache.
fn hit(job: &JobRecord) -> bool {
    matches!(job.ran, Ran::ActionCache | Ran::DiskCache)
}

/// The report: one line per job of NEW that missed, with its causes.
pub fn run(old: &Path, new: &Path) -> Result<String> {
    let (old, new) = (read(old)?, read(new)?);
    let missed: Vec<&JobRecord> = new
        .jobs
        .iter()
        .filter(|job| !hit(job) && job.ran != Ran::NotStarted)
        .collect();
    let mut out = String::new();
    if missed.is_empty() {
        out.push_str("every job of NEW came from a cache: nothing to explain\n");
        return Ok(out);
    }
    for job in &missed {
        let _ = writeln!(
            out,
            "{}: {}",
            label(job),
            explain(job, &old.jobs).join("; ")
        );
    }
    let _ = writeln!(
        out,
        "{} of {} jobs missed the cache",
        missed.len(),
        new.jobs.len()
    );
    Ok(out)
}

fn read(path: &Path) -> Result<StatsFile> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text)
        .with_context(|| format!("{} is not a --stats-json file", path.display()))
}

/// Why `job` (of NEW) missed, compared with its counterpart in `old`.
fn explain(job: &JobRecord, old: &[JobRecord]) -> Vec<String> {
    let Some(new) = &job.parts else {
        return vec![
            "no Action recorded (the link ran without a cache: local mode without --disk-cache)"
                .to_owned(),
        ];
    };
    let by_content = old.iter().find(|o| {
        o.parts
            .as_ref()
            .is_some_and(|p| p.module.digest == new.module.digest)
    });
    let by_path = || {
        old.iter()
            .find(|o| same_module_path(&o.module, &job.module))
    };
    let Some(counterpart) = by_content.or_else(by_path) else {
        return vec!["a new module: no job of OLD has its content or its path".to_owned()];
    };
    let Some(before) = &counterpart.parts else {
        return vec![format!(
            "{} of OLD recorded no Action to compare with",
            label(counterpart)
        )];
    };
    if job.action.is_some() && job.action == counterpart.action {
        return vec![format!(
            "the same Action as {} of OLD: its result was not in this link's cache (another \
             cache, or evicted)",
            label(counterpart)
        )];
    }
    let mut causes = Vec::new();
    if before.module.digest != new.module.digest {
        causes.push("the module itself changed".to_owned());
    }
    causes.extend(import_changes(&before.imports, &new.imports));
    if causes.is_empty() && before.index_shard.digest != new.index_shard.digest {
        causes.push("the index shard only (a summary change elsewhere in the program)".to_owned());
    }
    if before.flags != new.flags {
        causes.push(flag_changes(&before.flags, &new.flags));
    }
    if before.compiler != new.compiler {
        causes.push(format!(
            "the compiler: {} before, {} now",
            before.compiler, new.compiler
        ));
    }
    if before.platform != new.platform {
        causes.push(format!(
            "the platform: [{}] before, [{}] now",
            before.platform.join(", "),
            new.platform.join(", ")
        ));
    }
    if causes.is_empty() {
        causes.push(format!(
            "the Action's command or input root differ from {} of OLD in another way (layout, \
             common inputs, outputs)",
            label(counterpart)
        ));
    }
    causes
}

/// What changed among the imported modules: each is matched to one of OLD by content, else by path.
fn import_changes(before: &[Arc<InputPart>], now: &[Arc<InputPart>]) -> Vec<String> {
    let mut unmatched: Vec<&Arc<InputPart>> = before.iter().collect();
    let mut differing = Vec::new();
    for import in now {
        match unmatched.iter().position(|b| b.digest == import.digest) {
            Some(i) => {
                unmatched.remove(i);
            }
            None => differing.push(import),
        }
    }
    let (mut changes, mut added) = (Vec::new(), Vec::new());
    for import in differing {
        let path = import.path.display();
        match unmatched
            .iter()
            .position(|b| same_module_path(&b.path, &import.path))
        {
            Some(i) => {
                unmatched.remove(i);
                changes.push(format!("an imported module changed: {path}"));
            }
            None => added.push(format!("imports a new module: {path}")),
        }
    }
    changes.extend(added);
    changes.extend(
        unmatched
            .iter()
            .map(|import| format!("no longer imports {}", import.path.display())),
    );
    changes
}

/// `flags: added -x; removed -y`.
fn flag_changes(before: &[String], now: &[String]) -> String {
    let (before_set, now_set): (BTreeSet<&String>, BTreeSet<&String>) =
        (before.iter().collect(), now.iter().collect());
    let added: Vec<&str> = now
        .iter()
        .filter(|f| !before_set.contains(f))
        .map(String::as_str)
        .collect();
    let removed: Vec<&str> = before
        .iter()
        .filter(|f| !now_set.contains(f))
        .map(String::as_str)
        .collect();
    let mut text = "the flags:".to_owned();
    if !added.is_empty() {
        let _ = write!(text, " added {}", added.join(" "));
    }
    if !removed.is_empty() {
        let _ = write!(
            text,
            "{} removed {}",
            if added.is_empty() { "" } else { ";" },
            removed.join(" ")
        );
    }
    if added.is_empty() && removed.is_empty() {
        text.push_str(" the same flags in another order");
    }
    text
}

/// Whether two module paths name the same module: equal, or, for archive members extracted by lld
/// (beside the link's output, so in whatever directory that was), the same file name once lld's
/// `.<task>.<PID>.o` suffix is dropped.
fn same_module_path(a: &Path, b: &Path) -> bool {
    a == b || member_stem(a).is_some_and(|stem| Some(stem) == member_stem(b))
}

/// `out/lib.a(m.o at 80).2.1C7A.o` → `lib.a(m.o at 80)`; `None` for a name without such a suffix.
fn member_stem(path: &Path) -> Option<&str> {
    let name = path.file_name()?.to_str()?.strip_suffix(".o")?;
    let (rest, pid) = name.rsplit_once('.')?;
    let (stem, task) = rest.rsplit_once('.')?;
    let is_task = !task.is_empty() && task.bytes().all(|b| b.is_ascii_digit());
    let is_pid = !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_hexdigit());
    (is_task && is_pid).then_some(stem)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(path: &str, digest: &str) -> Arc<InputPart> {
        Arc::new(InputPart {
            path: path.into(),
            digest: digest.to_owned(),
        })
    }

    #[test]
    fn archive_members_match_across_links_without_their_pid() {
        assert!(same_module_path(
            Path::new("old/libm (x).a(m.o at 80).2.1C7A.o"),
            Path::new("new/libm (x).a(m.o at 80).2.4F2.o")
        ));
        assert!(same_module_path(
            Path::new("libc_mul.libc.o158.3.3792.o"),
            Path::new("libc_mul.libc.o158.3.A1.o")
        ));
        assert!(!same_module_path(
            Path::new("libm.a(m.o at 80).2.1C7A.o"),
            Path::new("libm.a(n.o at 80).2.1C7A.o")
        ));
        assert!(same_module_path(Path::new("main.o"), Path::new("main.o")));
        assert!(!same_module_path(Path::new("a.o"), Path::new("b.o")));
    }

    #[test]
    fn imports_are_matched_by_content_then_by_path() {
        let before = [part("a.o", "1"), part("b.o", "2"), part("c.o", "3")];
        let now = [part("a.o", "1"), part("b.o", "9"), part("d.o", "4")];
        assert_eq!(
            import_changes(&before, &now),
            [
                "an imported module changed: b.o",
                "imports a new module: d.o",
                "no longer imports c.o"
            ]
        );
        // Renamed but the same content: no change.
        assert!(import_changes(&[part("x.1.A.o", "5")], &[part("y.o", "5")]).is_empty());
    }

    #[test]
    fn flag_changes_name_what_was_added_and_removed() {
        let s = |v: &[&str]| v.iter().map(|f| (*f).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            flag_changes(&s(&["-c", "-O2"]), &s(&["-c", "-O3", "-g"])),
            "the flags: added -O3 -g; removed -O2"
        );
        assert_eq!(
            flag_changes(&s(&["-c"]), &s(&["-c", "-g"])),
            "the flags: added -g"
        );
    }
}
