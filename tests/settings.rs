//! Malformed settings are refused before anything runs, with one line naming the option and where
//! the value came from, whichever source gave it: the command line, the environment or the config
//! file.

mod isolation;

use std::process::{Command, Output};

/// Runs `dtlto-reapi config` with `args`, `env` and (when given) a config file holding `toml`, in a
/// fresh directory.
fn run_config(args: &[&str], env: &[(&str, &str)], toml: Option<&str>) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dtlto-reapi"));
    isolation::isolate(&mut cmd)
        .current_dir(dir.path())
        .arg("config");
    if let Some(toml) = toml {
        std::fs::write(dir.path().join("dtlto-reapi.toml"), toml).unwrap();
    }
    cmd.args(args).envs(env.iter().copied());
    cmd.output().unwrap()
}

/// [`run_config`]'s exit success and stderr.
fn config(args: &[&str], env: &[(&str, &str)], toml: Option<&str>) -> (bool, String) {
    let out = run_config(args, env, toml);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// [`run_config`]'s exit success and its report of the settings, errors after it.
fn config_stdout(args: &[&str], env: &[(&str, &str)], toml: Option<&str>) -> (bool, String) {
    let out = run_config(args, env, toml);
    let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text.into_owned())
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
    let durations = [
        (
            "--remote-timeout",
            "DTLTO_REAPI_REMOTE_TIMEOUT",
            "remote-timeout",
            "30x",
            "not a duration",
        ),
        (
            "--remote-execute-timeout",
            "DTLTO_REAPI_REMOTE_EXECUTE_TIMEOUT",
            "remote-execute-timeout",
            "1.5h",
            "not a duration",
        ),
        (
            "--credential-helper-timeout",
            "DTLTO_REAPI_CREDENTIAL_HELPER_TIMEOUT",
            "credential-helper-timeout",
            "ms",
            "not a duration",
        ),
    ];
    for (option, var, key, bad, says) in cases.into_iter().chain(durations) {
        let flag = format!("{option}={bad}");
        refused(config(&[&flag], &[], None), &[option, "command line", says]);
        refused(config(&[], &[(var, bad)], None), &[option, var, says]);
        let toml = if key == "remote" || key.ends_with("-timeout") {
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

#[test]
fn durations_take_units_and_plain_seconds_from_every_source() {
    let shown = |(ok, stdout): (bool, String), line: &str| {
        assert!(ok, "refused: {stdout}");
        assert!(
            stdout.lines().any(|l| l.starts_with(line)),
            "no {line:?} in {stdout}"
        );
    };
    shown(
        config_stdout(&["--remote-timeout=500ms"], &[], None),
        "remote-timeout = \"500ms\"  # command line",
    );
    shown(
        config_stdout(&["--remote-timeout=45"], &[], None),
        "remote-timeout = \"45s\"",
    );
    shown(
        config_stdout(&[], &[("DTLTO_REAPI_REMOTE_EXECUTE_TIMEOUT", "2m")], None),
        "remote-execute-timeout = \"120s\"  # environment",
    );
    // A config file may give whole seconds as a number, as before, or a string with a unit.
    let toml = "credential-helper-timeout = 3\nremote-timeout = \"1h\"\n";
    let out = config_stdout(&[], &[], Some(toml));
    shown(
        out.clone(),
        "credential-helper-timeout = \"3s\"  # config file",
    );
    shown(out, "remote-timeout = \"3600s\"  # config file");
    // Zero means the default.
    shown(
        config_stdout(&["--remote-timeout=0s"], &[], None),
        "remote-timeout = \"60s\"",
    );
    // A malformed number in the config file is refused as the others are.
    refused(
        config(&[], &[], Some("remote-timeout = -3\n")),
        &["--remote-timeout", "config file", "not a duration"],
    );
}
