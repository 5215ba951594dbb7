//! Rewriting the file names inside a compile's arguments.
//!
//! A job's arguments name its files either as a whole argument (`t1.o`, `-o` `t1.native.o`) or after a
//! flag (`-fthinlto-index=t1.native.o.thinlto.bc`). Whenever a file is given another name — a staged
//! output, a path inside an action's input root — every argument naming it must follow, consistently.
//!
//! And a file the arguments name is read by the compiler, so its content must be in the Action key:
//! [`named_files`] finds the files that the job file does not list, and the arguments whose effect
//! no key can describe.

use std::path::Path;

/// Rewrites every argument that names a file `rename` knows: the whole argument, or the part after
/// the first `=` of a `-flag=PATH` argument.
pub fn rewrite_args(args: &[String], rename: impl Fn(&str) -> Option<String>) -> Vec<String> {
    args.iter()
        .map(|arg| {
            if let Some(new) = rename(arg) {
                return new;
            }
            if arg.starts_with('-')
                && let Some((flag, path)) = arg.split_once('=')
                && let Some(new) = rename(path)
            {
                return format!("{flag}={new}");
            }
            arg.clone()
        })
        .collect()
}

/// Arguments that take a file the key cannot describe: `(argument, why)`.
const REFUSED: &[(&str, &str)] = &[
    (
        "--config",
        "a clang configuration file holds options, and names files, that are not in the Action key",
    ),
    ("-fpass-plugin", PLUGIN),
    ("-fplugin", PLUGIN),
    ("-load", PLUGIN),
];

const PLUGIN: &str = "a compiler plugin is code loaded into the compiler, with libraries and \
                      behaviour of its own that are not in the Action key";

/// The files that `args` (a compile's arguments after the compiler) name and the compiler reads,
/// beyond those `listed` already knows: the value of every `-flag=VALUE` argument (also inside
/// `-mllvm`) and every value given to `-mllvm` or `-Xclang`, when it names a regular file
/// (relative to `cwd`). An argument whose effect no key can describe — a configuration file
/// (`--config`), a plugin (`-fpass-plugin=`, `-fplugin=`, `-load`), a response file (`@FILE`), a
/// CPU named `native` (this machine's, not a worker's) — is an error saying why.
pub fn named_files(
    args: &[String],
    cwd: &Path,
    listed: impl Fn(&str) -> bool,
) -> Result<Vec<String>, String> {
    let mut files: Vec<String> = Vec::new();
    let mut after_value_flag = false;
    for arg in args {
        let flag = arg.split_once('=').map_or(arg.as_str(), |(flag, _)| flag);
        if let Some((_, why)) = REFUSED.iter().find(|(refused, _)| *refused == flag) {
            return Err(format!("{arg}: {why}"));
        }
        if matches!(flag, "-march" | "-mcpu" | "-mtune") && arg.ends_with("=native") {
            return Err(format!(
                "{arg}: `native` is the CPU of the machine that runs the compile, which is not in \
                 the Action key: name the CPU"
            ));
        }
        if arg.starts_with('@') {
            return Err(format!(
                "{arg}: a response file holds arguments, and names files, that are not in the \
                 Action key"
            ));
        }
        let value = match arg.split_once('=') {
            Some((_, value)) if arg.starts_with('-') => Some(value),
            _ if after_value_flag && !arg.starts_with('-') => Some(arg.as_str()),
            _ => None,
        };
        after_value_flag = arg == "-mllvm" || arg == "-Xclang";
        let Some(value) = value.filter(|v| !v.is_empty() && !listed(v)) else {
            continue;
        };
        if cwd.join(value).is_file() && !files.iter().any(|f| f == value) {
            files.push(value.to_owned());
        }
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|a| (*a).to_owned()).collect()
    }

    #[test]
    fn files_named_in_arguments_are_found_unless_listed() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["remarks.yaml", "listed.prof", "ir", "sub/x.txt"] {
            let path = dir.path().join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, "x").unwrap();
        }
        let args = strings(&[
            "clang",
            "-x",
            "ir",
            "-O2",
            "-mllvm",
            "-opt-file=remarks.yaml",
            "-fprofile-sample-use=listed.prof",
            "-mllvm",
            "sub/x.txt",
            "-mllvm",
            "-limit=3",
            "--target=x86_64-linux-gnu",
            "-mllvm=remarks.yaml",
        ]);
        let found = named_files(&args, dir.path(), |p| p == "listed.prof").unwrap();
        // `ir` after `-x` is not a file name, even though such a file exists.
        assert_eq!(found, ["remarks.yaml", "sub/x.txt"]);
    }

    #[test]
    fn configuration_files_plugins_and_response_files_are_refused() {
        let cwd = Path::new("/");
        for arg in [
            "--config=x.cfg",
            "--config",
            "-fpass-plugin=/p.so",
            "-fplugin=p.so",
            "-load",
            "@args.rsp",
            "-mcpu=native",
        ] {
            let err = named_files(&strings(&["-O2", arg]), cwd, |_| false).unwrap_err();
            assert!(err.starts_with(arg), "{err}");
            assert!(err.contains("not in the Action key"), "{err}");
            assert!(!err.contains('\n'), "{err}");
        }
    }

    #[test]
    fn whole_and_flag_arguments() {
        let args: Vec<String> = [
            "t1.o",
            "-fthinlto-index=t1.bc",
            "-o",
            "t1.n.o",
            "-O2",
            "-x=t1.o",
        ]
        .map(String::from)
        .to_vec();
        let out = rewrite_args(&args, |p| match p {
            "t1.o" => Some("in/m.o".into()),
            "t1.bc" => Some("in/s.bc".into()),
            "t1.n.o" => Some("out.o".into()),
            _ => None,
        });
        assert_eq!(
            out,
            [
                "in/m.o",
                "-fthinlto-index=in/s.bc",
                "-o",
                "out.o",
                "-O2",
                "-x=in/m.o"
            ]
        );
    }

    #[test]
    fn values_that_are_not_flags_are_left_alone() {
        let args = vec!["a=t1.o".to_owned()];
        assert_eq!(rewrite_args(&args, |_| None), args);
        assert_eq!(
            rewrite_args(&args, |p| (p == "t1.o").then(|| "x".into())),
            args
        );
    }
}
