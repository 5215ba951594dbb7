//! Rewriting the file names inside a compile's arguments.
//!
//! A job's arguments name its files either as a whole argument (`t1.o`, `-o` `t1.native.o`) or after a
//! flag (`-fthinlto-index=t1.native.o.thinlto.bc`). Whenever a file is given another name — a staged
//! output, a path inside an action's input root — every argument naming it must follow, consistently.

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

#[cfg(test)]
mod tests {
    use super::*;

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
