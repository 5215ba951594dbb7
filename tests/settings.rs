//! Malformed settings are refused before anything runs, with one line naming the option and where
//! the value came from, whichever source gave it: the command line, the environment or the config
//! file.

mod isolation;

use std::process::Command;

/// Runs `dtlto-reapi config` with `args`, `env` and (when given) a config file holding `toml`, in a
/// fresh directory; returns the exit success and stderr.
fn config(args: &[&str], env: &[(&str, &str)], toml: Option<&str>) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dtlto-reapi"));
    isolation::isolate(&mut cmd)
        .current_dir(dir.path())
        .arg("config");
    if let Some(toml) = toml {
        std::fs::write(dir.path().join("dtlto-reapi.toml"), toml).unwrap();
    }
    cmd.args(args).envs(env.iter().copied());
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Panics unless the command failed with one error line containing every one of `needles`.
fn refused((ok, stderr): (bool, String), needles: &[&str]) {
    assert!(!ok, "accepted: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "not one line: {stderr}");
    for needle in needles {
        assert!(lines[0].contains(needle), "{needle:?} not in {stderr}");
    }
}

#[test]
fn malformed_values_are_refused_from_every_source() {
    // (option, environment variable, config key, bad value, what the line says)
    let cases = [
        (
            "--platform",
            "DTLTO_REAPI_PLATFORM",
            "platform",
            "novalue",
            "NAME=VALUE",
        ),
        (
            "--remote",
            "DTLTO_REAPI_REMOTE",
            "remote",
            "htp://x",
            "unknown scheme",
        ),
        (
            "--remote-header",
            "DTLTO_REAPI_REMOTE_HEADER",
            "remote-header",
            "novalue",
            "NAME=VALUE",
        ),
        (
            "--credential-helper",
            "DTLTO_REAPI_CREDENTIAL_HELPER",
            "credential-helper",
            "bad host=/h",
            "not a host name",
        ),
    ];
    for (option, var, key, bad, says) in cases {
        let flag = format!("{option}={bad}");
        refused(config(&[&flag], &[], None), &[option, "command line", says]);
        refused(config(&[], &[(var, bad)], None), &[option, var, says]);
        let toml = if key == "remote" {
            format!("{key} = \"{bad}\"\n")
        } else {
            format!("{key} = [\"{bad}\"]\n")
        };
        refused(
            config(&[], &[], Some(&toml)),
            &[option, "config file", says],
        );
    }
}

#[test]
fn header_values_are_never_shown_in_the_refusal() {
    let (ok, stderr) = config(&["--remote-header=s3cret-token"], &[], None);
    assert!(!ok && !stderr.contains("s3cret"), "{stderr}");
}

#[test]
fn well_formed_values_are_accepted() {
    let (ok, stderr) = config(
        &[
            "--remote=grpcs://cluster.example:443",
            "--remote-header=x-api-key=env:KEY",
            "--platform=OSFamily=linux",
            "--credential-helper=*.example=/opt/helper",
        ],
        &[],
        None,
    );
    assert!(ok, "{stderr}");
}
