//! lld's job file: parsing and validation.
//!
//! lld writes one JSON file per link (`<output>.<pid>.dist-file.json`) and passes its path as the
//! distributor's last argument. This module turns it into typed [`Job`]s and checks everything a
//! backend compile relies on *before* anything runs, so that a bad file produces one clear line per
//! problem (job index, module path, field) instead of a confusing compiler error later.
//!
//! The format (LLVM 21 and 22):
//! `{"common": {"linker_output", "args", "inputs"}, "jobs": [{"args", "inputs", "outputs"}]}`
//! where a job's command is `common.args ++ job.args`, `inputs[0]` is the module's bitcode,
//! `inputs[1]` its index shard, `inputs[2..]` the modules it imports, and `outputs[0]` the native
//! object.

use std::ffi::OsStr;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHashSet};
use serde_json::{Map, Value};

/// A parsed and validated job file.
#[derive(Debug, Clone)]
pub struct JobFile {
    /// Where the job file was read from (as given on the command line).
    pub path: PathBuf,
    /// `common.args`: the compiler followed by the arguments every job shares.
    pub common_args: Vec<String>,
    /// `common.inputs`: files every job needs (e.g. a sample profile).
    pub common_inputs: Vec<PathBuf>,
    pub jobs: Vec<Job>,
}

/// One ThinLTO backend compile. Cheap to clone (its lists are shared): a job is handed from the
/// scheduler to planning and execution, and may list ~100 imports.
#[derive(Debug, Clone)]
pub struct Job {
    /// Position in the job file, for messages.
    pub index: usize,
    pub args: Arc<[String]>,
    /// `[module, index shard, imported modules...]`; validated to hold at least two entries.
    pub inputs: Arc<[PathBuf]>,
    /// `[native object, other outputs...]`; validated to hold at least one entry.
    pub outputs: Arc<[PathBuf]>,
}

impl Job {
    /// The module this job compiles (`inputs[0]`), which names the job in every message.
    pub fn module(&self) -> &Path {
        &self.inputs[0]
    }

    /// The job's summary index shard (`inputs[1]`).
    pub fn index_shard(&self) -> &Path {
        &self.inputs[1]
    }

    /// The modules this job imports from (`inputs[2..]`).
    pub fn imports(&self) -> &[PathBuf] {
        &self.inputs[2..]
    }

    /// `job N (module M)`: how messages name a job.
    pub fn label(&self) -> String {
        format!("job {} ({})", self.index, self.module().display())
    }
}

/// Everything wrong with a job file, one problem per line.
#[derive(Debug)]
pub struct JobFileError {
    pub path: PathBuf,
    pub problems: Vec<String>,
}

impl fmt::Display for JobFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.problems.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "job file {}: {problem}", self.path.display())?;
        }
        Ok(())
    }
}

impl std::error::Error for JobFileError {}

impl JobFile {
    /// Reads, parses and validates the job file at `path`. Relative paths inside it are relative to
    /// the current directory (the link's working directory), as lld intends.
    pub fn load(path: &Path) -> Result<JobFile, JobFileError> {
        let fail = |problem: String| JobFileError {
            path: path.to_owned(),
            problems: vec![problem],
        };
        let text = std::fs::read(path).map_err(|e| fail(format!("cannot read: {e}")))?;
        // A well-formed file goes straight into typed jobs; only one that is not is parsed into a
        // `Value` tree (several times the file's size in small allocations, whose freed memory
        // the process keeps: at 50,000 jobs, most of a link's peak RSS) to say what is wrong.
        let job_file = match serde_json::from_slice::<Raw>(&text) {
            Ok(raw) => JobFile::from_raw(path, raw)?,
            Err(_) => {
                let value: Value = serde_json::from_slice(&text)
                    .map_err(|e| fail(format!("not valid JSON: {e}")))?;
                JobFile::from_json(path, &value)?
            }
        };
        drop(text);
        job_file.check_files()?;
        Ok(job_file)
    }

    /// Builds a job file from its typed form, with the checks of [`JobFile::from_json`] that the
    /// types do not make.
    fn from_raw(path: &Path, raw: Raw) -> Result<JobFile, JobFileError> {
        let mut problems = Vec::new();
        if raw.common.args.is_empty() {
            problems.push(EMPTY_ARGS.to_owned());
        }
        let common_inputs = raw.common.inputs.into_iter().map(PathBuf::from).collect();
        let mut jobs = Vec::with_capacity(raw.jobs.len());
        for (index, job) in raw.jobs.into_iter().enumerate() {
            let fields = (job.args, Some(job.inputs), Some(job.outputs));
            match checked_job(index, fields, Vec::new()) {
                Ok(job) => jobs.push(job),
                Err(mut p) => problems.append(&mut p),
            }
        }
        finish(path, raw.common.args, common_inputs, jobs, problems)
    }

    /// Builds a job file from parsed JSON, checking its shape (not the file system).
    pub fn from_json(path: &Path, value: &Value) -> Result<JobFile, JobFileError> {
        let mut problems = Vec::new();
        let root = value.as_object();
        if root.is_none() {
            problems.push("the top level is not a JSON object".to_owned());
        }
        let common = root.and_then(|r| r.get("common"));
        let common = match common {
            Some(Value::Object(c)) => Some(c),
            Some(_) => {
                problems.push("`common` is not an object".to_owned());
                None
            }
            None if root.is_some() => {
                problems.push("missing `common`".to_owned());
                None
            }
            None => None,
        };
        let mut common_args = Vec::new();
        let mut common_inputs = Vec::new();
        if let Some(common) = common {
            match strings(common, "args", "common") {
                Ok(Some(args)) if args.is_empty() => problems.push(EMPTY_ARGS.to_owned()),
                Ok(Some(args)) => common_args = args,
                Ok(None) => problems.push("missing `common.args`".to_owned()),
                Err(p) => problems.push(p),
            }
            match strings(common, "inputs", "common") {
                Ok(inputs) => {
                    common_inputs = inputs
                        .unwrap_or_default()
                        .into_iter()
                        .map(PathBuf::from)
                        .collect()
                }
                Err(p) => problems.push(p),
            }
            if common.get("linker_output").is_some_and(|v| !v.is_string()) {
                problems.push("`common.linker_output` is not a string".to_owned());
            }
        }

        let mut jobs = Vec::new();
        match root.and_then(|r| r.get("jobs")) {
            Some(Value::Array(list)) => {
                for (index, entry) in list.iter().enumerate() {
                    match parse_job(index, entry) {
                        Ok(job) => jobs.push(job),
                        Err(mut p) => problems.append(&mut p),
                    }
                }
            }
            Some(_) => problems.push("`jobs` is not an array".to_owned()),
            None if root.is_some() => problems.push("missing `jobs`".to_owned()),
            None => {}
        }
        finish(path, common_args, common_inputs, jobs, problems)
    }

    /// Every listed input must exist, and no output may be a directory, before anything runs: either
    /// would otherwise surface as a compiler error (or a failed rename) far from its cause.
    fn check_files(&self) -> Result<(), JobFileError> {
        let mut problems = Vec::new();
        for input in &self.common_inputs {
            if !input.exists() {
                problems.push(format!(
                    "`common.inputs`: {} does not exist",
                    input.display()
                ));
            }
        }
        // Each file once (one `stat`), however many jobs import it; keyed by the path's bytes,
        // which hash much faster than a `Path`'s components (~100 inputs per job).
        let mut checked: FxHashMap<&OsStr, Option<&str>> = FxHashMap::default();
        for job in &self.jobs {
            for (i, input) in job.inputs.iter().enumerate() {
                let problem = *checked.entry(input.as_os_str()).or_insert_with(|| {
                    match std::fs::metadata(input) {
                        Ok(meta) if meta.is_file() => None,
                        Ok(_) => Some("is not a regular file"),
                        Err(_) => Some("does not exist"),
                    }
                });
                if let Some(what) = problem {
                    problems.push(format!(
                        "{}: `inputs[{i}]` {} {what}",
                        job.label(),
                        input.display()
                    ));
                }
            }
            for (i, output) in job.outputs.iter().enumerate() {
                if output.is_dir() {
                    problems.push(format!(
                        "{}: `outputs[{i}]` {} is a directory",
                        job.label(),
                        output.display()
                    ));
                }
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(JobFileError {
                path: self.path.clone(),
                problems,
            })
        }
    }

    /// The compiler every job runs (`common.args[0]`).
    pub fn compiler(&self) -> &str {
        &self.common_args[0]
    }

    /// The arguments lld put between the compiler and its own, which start with `-c`: those of
    /// `--thinlto-remote-compiler-prepend-arg` (`clang` for a multi-call binary such as zig).
    pub fn prepended_args(&self) -> &[String] {
        let after_compiler = &self.common_args[1..];
        let own = after_compiler.iter().position(|arg| arg == "-c");
        &after_compiler[..own.unwrap_or(0)]
    }

    /// The full command line of `job`: `common.args ++ job.args`.
    pub fn command(&self, job: &Job) -> Vec<String> {
        self.common_args
            .iter()
            .chain(job.args.iter())
            .cloned()
            .collect()
    }
}

fn parse_job(index: usize, entry: &Value) -> Result<Job, Vec<String>> {
    let Some(obj) = entry.as_object() else {
        return Err(vec![format!("job {index}: not a JSON object")]);
    };
    let context = format!("jobs[{index}]");
    let mut problems = Vec::new();
    // `None` when the field is absent or malformed (already reported).
    let mut field = |name: &str| match strings(obj, name, &context) {
        Ok(Some(v)) => Some(v),
        Ok(None) => {
            problems.push(format!("missing `{name}`"));
            None
        }
        Err(p) => {
            problems.push(p);
            None
        }
    };
    let fields = (
        field("args").unwrap_or_default(),
        field("inputs"),
        field("outputs"),
    );
    checked_job(index, fields, problems)
}

/// The fields of a job: `args`, and `inputs` and `outputs` (`None` when absent or malformed).
type JobFields = (Vec<String>, Option<Vec<String>>, Option<Vec<String>>);

/// The job at `index` from its fields, or every problem with it (`problems`: those found
/// already), each line naming the job.
fn checked_job(
    index: usize,
    (args, inputs, outputs): JobFields,
    mut problems: Vec<String>,
) -> Result<Job, Vec<String>> {
    if let Some(inputs) = inputs.as_ref().filter(|i| i.len() < 2) {
        problems.push(format!(
            "`inputs` lists {} file(s); a job needs at least its module and its index shard",
            inputs.len()
        ));
    }
    if outputs.as_ref().is_some_and(Vec::is_empty) {
        problems.push("`outputs` is empty; a job needs at least its native object".to_owned());
    }
    let inputs = inputs.unwrap_or_default();
    let outputs = outputs.unwrap_or_default();
    for (i, input) in inputs.iter().enumerate() {
        if input.is_empty() {
            problems.push(format!("`inputs[{i}]` is an empty path"));
        }
    }
    for (i, output) in outputs.iter().enumerate() {
        if output.is_empty() {
            problems.push(format!("`outputs[{i}]` is an empty path"));
        }
    }
    if problems.is_empty() {
        Ok(Job {
            index,
            args: args.into(),
            inputs: inputs.into_iter().map(PathBuf::from).collect(),
            outputs: outputs.into_iter().map(PathBuf::from).collect(),
        })
    } else {
        let label = match inputs.first() {
            Some(module) => format!("job {index} ({module})"),
            None => format!("job {index}"),
        };
        Err(problems
            .into_iter()
            .map(|p| format!("{label}: {p}"))
            .collect())
    }
}

/// A job file of the right shape, read without a `Value` tree. Unknown fields are ignored, as
/// [`JobFile::from_json`] ignores them; anything this does not accept is read again as a `Value`,
/// whose checks name the problem.
#[derive(serde::Deserialize)]
struct Raw {
    common: RawCommon,
    jobs: Vec<RawJob>,
}

#[derive(serde::Deserialize)]
struct RawCommon {
    args: Vec<String>,
    #[serde(default)]
    inputs: Vec<String>,
    /// Only checked to be a string when present (`null` is not).
    #[serde(default, rename = "linker_output", deserialize_with = "a_string")]
    _linker_output: (),
}

fn a_string<'de, D: serde::Deserializer<'de>>(value: D) -> Result<(), D::Error> {
    <String as serde::Deserialize>::deserialize(value).map(drop)
}

#[derive(serde::Deserialize)]
struct RawJob {
    args: Vec<String>,
    inputs: Vec<String>,
    outputs: Vec<String>,
}

const EMPTY_ARGS: &str = "`common.args` is empty: it must start with the compiler";

/// The job file, or every problem found (`problems`, and outputs that clash).
fn finish(
    path: &Path,
    common_args: Vec<String>,
    common_inputs: Vec<PathBuf>,
    jobs: Vec<Job>,
    mut problems: Vec<String>,
) -> Result<JobFile, JobFileError> {
    problems.extend(clashing_outputs(&jobs, &common_inputs));
    if problems.is_empty() {
        Ok(JobFile {
            path: path.to_owned(),
            common_args,
            common_inputs,
            jobs,
        })
    } else {
        Err(JobFileError {
            path: path.to_owned(),
            problems,
        })
    }
}

/// Reads `obj[name]` as an array of strings: `Ok(None)` when absent, `Err` naming the field when it
/// has the wrong type.
fn strings(
    obj: &Map<String, Value>,
    name: &str,
    context: &str,
) -> Result<Option<Vec<String>>, String> {
    let Some(value) = obj.get(name) else {
        return Ok(None);
    };
    let Value::Array(items) = value else {
        return Err(format!("`{context}.{name}` is not an array of strings"));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match item {
            Value::String(s) => Ok(s.clone()),
            _ => Err(format!("`{context}.{name}[{i}]` is not a string")),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// A path as the file system resolves it from the working directory, without following symlinks:
/// `./x`, `x` and `$PWD/x` are the same file. Given an absolute path, it asks the system nothing.
fn normalized(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_owned())
}

/// Outputs that would overwrite another job's output or any job's input (or a `common.inputs` file),
/// compared after normalisation. Two jobs writing the same file would race, and an output that is
/// an input destroys what a compile reads; lld never does either, so it signals a corrupt file.
fn clashing_outputs(jobs: &[Job], common_inputs: &[PathBuf]) -> Vec<String> {
    // The working directory once, not once per path.
    let cwd = std::env::current_dir().unwrap_or_default();
    let normalized = |path: &Path| normalized(&cwd.join(path));
    // FxHash: a link names ~100,000 paths at 1,000 jobs, all its own.
    let mut inputs = FxHashMap::default();
    for input in common_inputs {
        inputs
            .entry(normalized(input))
            .or_insert_with(|| "an input of every job (`common.inputs`)".to_owned());
    }
    // Each spelling once: most inputs are modules that ~100 jobs import.
    let mut spelled = FxHashSet::default();
    for job in jobs {
        for input in job.inputs.iter() {
            if spelled.insert(input.as_os_str()) {
                inputs
                    .entry(normalized(input))
                    .or_insert_with(|| format!("an input of job {}", job.index));
            }
        }
    }
    let mut outputs = FxHashMap::default();
    let mut problems = Vec::new();
    for job in jobs {
        for (i, output) in job.outputs.iter().enumerate() {
            let key = normalized(output);
            let clash = match (inputs.get(&key), outputs.get(&key)) {
                (Some(input), _) => Some(input.clone()),
                (None, Some(first)) => Some(format!("also an output of job {first}")),
                (None, None) => None,
            };
            match clash {
                Some(what) => problems.push(format!(
                    "{}: `outputs[{i}]` {} is {what}",
                    job.label(),
                    output.display()
                )),
                None => {
                    outputs.insert(key, job.index);
                }
            }
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(value: Value) -> Result<JobFile, JobFileError> {
        JobFile::from_json(Path::new("link.1.dist-file.json"), &value)
    }

    fn problems(value: Value) -> Vec<String> {
        parse(value).expect_err("should be rejected").problems
    }

    fn valid() -> Value {
        json!({"common": {"linker_output": "a.out", "args": ["clang", "-c", "-O2"], "inputs": []},
               "jobs": [{"args": ["t1.o", "-fthinlto-index=t1.1.9.native.o.thinlto.bc", "-o", "t1.1.9.native.o"],
                         "inputs": ["t1.o", "t1.1.9.native.o.thinlto.bc", "t2.o"],
                         "outputs": ["t1.1.9.native.o"]}]})
    }

    #[test]
    fn parses_a_real_shape() {
        let file = parse(valid()).unwrap();
        assert_eq!(file.compiler(), "clang");
        let job = &file.jobs[0];
        assert_eq!(job.module(), Path::new("t1.o"));
        assert_eq!(job.index_shard(), Path::new("t1.1.9.native.o.thinlto.bc"));
        assert_eq!(job.imports(), &[PathBuf::from("t2.o")]);
        assert_eq!(file.command(job)[3], "t1.o");
        assert_eq!(file.command(job).len(), 7);
    }

    #[test]
    fn odd_names_survive() {
        let member = "libx.a(y.o at 80).2.1C7A.o";
        let emoji = "📁 dir (1)/🎁.a(α.o at 7).o";
        let file = parse(json!({"common": {"args": ["clang"]},
            "jobs": [{"args": [member], "inputs": [member, "s.bc", emoji], "outputs": ["o (1).o"]}]}))
        .unwrap();
        assert_eq!(file.jobs[0].module(), Path::new(member));
        assert_eq!(file.jobs[0].imports()[0], Path::new(emoji));
        assert!(file.common_inputs.is_empty());
        // No `-c` of lld's: nothing is known to be prepended.
        assert!(file.prepended_args().is_empty());
    }

    #[test]
    fn parses_lld_links_job_file() {
        // lld-link 22.1.8, `/thinlto-remote-compiler:<zig> /thinlto-remote-compiler-prepend-arg:clang`,
        // `t1.o t2.o libt3.lib`: the same schema as ld.lld's; the member named without parentheses.
        let text = include_str!("bitcode/testdata/coff-dist-file.json");
        let file = parse(serde_json::from_str(text).unwrap()).unwrap();
        assert_eq!(file.compiler(), "/opt/ziglang/zig");
        assert_eq!(file.prepended_args(), ["clang"]);
        let member = Path::new("libt3.libt3.o158.3.453F.o");
        assert_eq!(file.jobs[0].imports(), [member, Path::new("t2.o")]);
        assert_eq!(file.jobs[2].module(), member);
        let command = file.command(&file.jobs[2]);
        assert_eq!(
            command[..4],
            [
                "/opt/ziglang/zig",
                "clang",
                "-c",
                "--target=x86_64-pc-windows-msvc19.33.0"
            ]
        );
        assert_eq!(command[9], "libt3.libt3.o158.3.453F.o");
    }

    #[test]
    fn missing_common_args() {
        let p = problems(json!({"common": {"inputs": []}, "jobs": []}));
        assert_eq!(p, vec!["missing `common.args`"]);
    }

    #[test]
    fn wrong_types_name_the_field() {
        let p = problems(json!({"common": {"args": "clang -c"}, "jobs": {}}));
        assert_eq!(
            p,
            vec![
                "`common.args` is not an array of strings",
                "`jobs` is not an array"
            ]
        );
        let p = problems(json!({"common": {"args": ["clang", 3]}, "jobs": []}));
        assert_eq!(p, vec!["`common.args[1]` is not a string"]);
    }

    #[test]
    fn job_problems_name_index_module_and_field() {
        let p = problems(json!({"common": {"args": ["clang"]},
            "jobs": [{"args": [], "inputs": ["m.o"], "outputs": []},
                     {"args": [], "outputs": ["x.o"]},
                     "nonsense"]}));
        assert_eq!(
            p,
            vec![
                "job 0 (m.o): `inputs` lists 1 file(s); a job needs at least its module and its index shard",
                "job 0 (m.o): `outputs` is empty; a job needs at least its native object",
                "job 1: missing `inputs`",
                "job 2: not a JSON object",
            ]
        );
    }

    #[test]
    fn duplicate_outputs_are_rejected() {
        let job = json!({"args": [], "inputs": ["a.o", "a.bc"], "outputs": ["same.o"]});
        let p = problems(json!({"common": {"args": ["clang"]}, "jobs": [job.clone(), job]}));
        assert_eq!(
            p,
            vec!["job 1 (a.o): `outputs[0]` same.o is also an output of job 0"]
        );
    }

    #[test]
    fn outputs_are_compared_after_normalisation() {
        let cwd = std::env::current_dir().unwrap();
        let job = |module: &str, output: PathBuf| json!({"args": [], "inputs": [module, format!("{module}.bc")], "outputs": [output]});
        let file = |jobs: Vec<Value>| {
            problems(json!({"common": {"args": ["clang"], "inputs": ["prof.data"]}, "jobs": jobs}))
        };
        assert_eq!(
            file(vec![job("a.o", "x.o".into()), job("b.o", "./x.o".into())]),
            vec!["job 1 (b.o): `outputs[0]` ./x.o is also an output of job 0"]
        );
        assert_eq!(
            file(vec![job("a.o", "x.o".into()), job("b.o", cwd.join("a.o"))]),
            vec![format!(
                "job 1 (b.o): `outputs[0]` {} is an input of job 0",
                cwd.join("a.o").display()
            )]
        );
        assert_eq!(
            file(vec![job("a.o", "./a.o.bc".into())]),
            vec!["job 0 (a.o): `outputs[0]` ./a.o.bc is an input of job 0"]
        );
        assert_eq!(
            file(vec![job("a.o", cwd.join("./prof.data"))]),
            vec![format!(
                "job 0 (a.o): `outputs[0]` {} is an input of every job (`common.inputs`)",
                cwd.join("./prof.data").display()
            )]
        );
    }

    #[test]
    fn not_an_object() {
        assert_eq!(
            problems(json!([1, 2])),
            vec!["the top level is not a JSON object"]
        );
    }

    #[test]
    fn load_reports_unreadable_invalid_and_missing_files() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.json");
        let err = JobFile::load(&missing).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("job file {}: cannot read:", missing.display())),
            "{err}"
        );

        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, b"{\"common\": ").unwrap();
        let err = JobFile::load(&bad).unwrap_err().to_string();
        assert!(err.contains("not valid JSON"), "{err}");

        let module = dir.path().join("m (1).o");
        std::fs::write(&module, b"x").unwrap();
        let file = dir.path().join("ok.json");
        let json = json!({"common": {"args": ["clang"]},
            "jobs": [{"args": [], "inputs": [module, dir.path().join("gone.bc")], "outputs": ["o.o"]}]});
        std::fs::write(&file, json.to_string()).unwrap();
        let err = JobFile::load(&file).unwrap_err();
        assert_eq!(err.problems.len(), 1);
        assert!(err.problems[0].starts_with(&format!("job 0 ({}): `inputs[1]`", module.display())));
        assert!(err.problems[0].ends_with("gone.bc does not exist"));

        // A file checked once is still reported for every job that lists it.
        let json = json!({"common": {"args": ["clang"]},
            "jobs": [{"args": [], "inputs": [&module, dir.path()], "outputs": ["a.o"]},
                     {"args": [], "inputs": [&module, dir.path()], "outputs": ["b.o"]}]});
        std::fs::write(&file, json.to_string()).unwrap();
        let err = JobFile::load(&file).unwrap_err();
        assert_eq!(err.problems.len(), 2, "{:?}", err.problems);
        assert!(
            err.problems
                .iter()
                .all(|p| p.ends_with("is not a regular file"))
        );

        let shard = dir.path().join("m.bc");
        std::fs::write(&shard, b"x").unwrap();
        let out_dir = dir.path().join("o.o");
        std::fs::create_dir(&out_dir).unwrap();
        let json = json!({"common": {"args": ["clang"]},
            "jobs": [{"args": [], "inputs": [&module, &shard], "outputs": [&out_dir]}]});
        std::fs::write(&file, json.to_string()).unwrap();
        let err = JobFile::load(&file).unwrap_err();
        assert_eq!(
            err.problems,
            vec![format!(
                "job 0 ({}): `outputs[0]` {} is a directory",
                module.display(),
                out_dir.display()
            )]
        );
    }

    /// Arbitrary JSON, biased towards the job file's own keys so that the fuzzing reaches deep.
    fn json_value() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let key = prop_oneof![
            Just("common".to_owned()),
            Just("jobs".to_owned()),
            Just("args".to_owned()),
            Just("inputs".to_owned()),
            Just("outputs".to_owned()),
            Just("linker_output".to_owned()),
            ".{0,4}",
        ];
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            ".{0,12}".prop_map(Value::from),
        ];
        leaf.prop_recursive(5, 64, 6, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
                proptest::collection::btree_map(key.clone(), inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// Job files of the right shape or nearly: short lists (empty ones too) of short names (empty
    /// ones too, and clashing ones), `common.inputs` absent or not, `linker_output` absent, a
    /// string, `null` or a number.
    fn job_file_like() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let strings =
            proptest::collection::vec(prop_oneof![Just(String::new()), "[ab]{1,2}"], 0..4);
        let job = (strings.clone(), strings.clone(), strings.clone()).prop_map(
            |(args, inputs, outputs)| json!({"args": args, "inputs": inputs, "outputs": outputs}),
        );
        let linker_output = prop_oneof![
            Just(None),
            Just(Some(Value::Null)),
            Just(Some(json!("a.out"))),
            Just(Some(json!(3))),
        ];
        let jobs = proptest::collection::vec(job, 0..4);
        (
            strings.clone(),
            proptest::option::of(strings),
            linker_output,
            jobs,
        )
            .prop_map(|(args, inputs, linker_output, jobs)| {
                let mut common = json!({ "args": args });
                if let Some(inputs) = inputs {
                    common["inputs"] = json!(inputs);
                }
                if let Some(linker_output) = linker_output {
                    common["linker_output"] = linker_output;
                }
                json!({"common": common, "jobs": jobs})
            })
    }

    proptest::proptest! {
        /// What the typed reading of `JobFile::load` accepts, it reads as the `Value` one does:
        /// the same jobs, or the same problems.
        #[test]
        fn typed_reading_agrees(value in proptest::prop_oneof![json_value(), job_file_like()]) {
            if let Ok(raw) = serde_json::from_value::<Raw>(value.clone()) {
                let typed = JobFile::from_raw(Path::new("link.1.dist-file.json"), raw);
                proptest::prop_assert_eq!(format!("{typed:?}"), format!("{:?}", parse(value)));
            }
        }

        /// Any input gives a job file or a clean list of problems: never a panic.
        #[test]
        fn arbitrary_json_never_panics(value in json_value()) {
            match parse(value) {
                Ok(file) => proptest::prop_assert!(file.jobs.iter().all(|j| j.inputs.len() >= 2 && !j.outputs.is_empty())),
                Err(e) => proptest::prop_assert!(!e.problems.is_empty()),
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
            if let Ok(value) = serde_json::from_slice::<Value>(&bytes) {
                let _ = parse(value);
            }
        }
    }
}
