//! The environment of every backend compile of a link, remote or local: the one its Action declares.
//!
//! A compile's environment can change its object (clang reads `CCC_OVERRIDE_OPTIONS`, for one), so
//! it is part of the Action key, and a local compile — local mode, cache-only misses, fallbacks,
//! results stored in the disk cache — runs with exactly this environment too, never the
//! distributor's: otherwise a result stored under a key would be another computation than the key
//! describes. It is a fixed set of variables, plus those the user names with `--pass-env`, taken
//! from the distributor's environment (and so in the key with their values).

use bazel_remote_apis::build::bazel::remote::execution::v2::command::EnvironmentVariable;

/// The variables every compile gets. `CLANG_NO_DEFAULT_CONFIG` stops clang from reading
/// configuration files (`clang.cfg`, `<triple>-clang.cfg` beside the compiler or in the system or
/// user config directories), whose content is in no key and which differ between this machine and
/// the workers; clang 16 and newer honour it. `PATH` serves a compiler given by a relative name.
const FIXED: &[(&str, &str)] = &[
    ("CLANG_NO_DEFAULT_CONFIG", "1"),
    ("LC_ALL", "C"),
    ("PATH", "/usr/local/bin:/usr/bin:/bin"),
];

/// The environment of a link's compiles, sorted by name (as REAPI requires of a Command's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Environment {
    vars: Vec<(String, String)>,
}

impl Environment {
    /// The fixed variables, and each variable named in `pass` with its value in this process's
    /// environment (one that is unset is left out, so the key says so). A passed variable replaces
    /// a fixed one of the same name.
    pub fn new(pass: &[String]) -> Result<Environment, String> {
        let mut vars: std::collections::BTreeMap<String, String> = FIXED
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect();
        for name in pass {
            if name.is_empty() || name.contains(['=', '\0']) {
                return Err(format!(
                    "--pass-env {name:?}: not an environment variable name"
                ));
            }
            match std::env::var_os(name) {
                None => {
                    vars.remove(name);
                }
                Some(value) => {
                    let value = value.into_string().map_err(|_| {
                        format!(
                            "--pass-env {name}: its value is not UTF-8, which an Action cannot hold"
                        )
                    })?;
                    vars.insert(name.clone(), value);
                }
            }
        }
        Ok(Environment {
            vars: vars.into_iter().collect(),
        })
    }

    /// `(name, value)` of every variable, sorted by name.
    pub fn vars(&self) -> &[(String, String)] {
        &self.vars
    }

    /// The value of `name`, if the environment has it.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.vars
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, value)| value.as_str())
    }

    /// The environment as a REAPI Command holds it.
    pub fn to_command(&self) -> Vec<EnvironmentVariable> {
        self.vars
            .iter()
            .map(|(name, value)| EnvironmentVariable {
                name: name.clone(),
                value: value.clone(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_variables_sorted_and_passed_ones_added_from_this_process() {
        let fixed = Environment::new(&[]).unwrap();
        let names: Vec<&str> = fixed.vars().iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["CLANG_NO_DEFAULT_CONFIG", "LC_ALL", "PATH"]);
        // Cargo sets CARGO_PKG_NAME for every test process; no test sets a variable named this.
        let unset = "DTLTO_REAPI_TEST_SURELY_UNSET_VARIABLE";
        let env = Environment::new(&["CARGO_PKG_NAME".to_owned(), unset.to_owned()]).unwrap();
        assert_eq!(env.get("CARGO_PKG_NAME"), Some(env!("CARGO_PKG_NAME")));
        assert_eq!(env.get(unset), None);
        let names: Vec<&str> = env.vars().iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "CARGO_PKG_NAME",
                "CLANG_NO_DEFAULT_CONFIG",
                "LC_ALL",
                "PATH"
            ]
        );
        assert_eq!(env.to_command()[0].value, env!("CARGO_PKG_NAME"));
    }

    #[test]
    fn a_passed_variable_replaces_a_fixed_one_and_bad_names_are_refused() {
        let path = std::env::var("PATH").unwrap();
        let env = Environment::new(&["PATH".to_owned()]).unwrap();
        assert_eq!(env.get("PATH"), Some(path.as_str()));
        for bad in ["", "A=B", "A\0"] {
            let err = Environment::new(&[bad.to_owned()]).unwrap_err();
            assert!(err.contains("not an environment variable name"), "{err}");
        }
    }
}
