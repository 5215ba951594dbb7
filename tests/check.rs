//! `dtlto-reapi check` against `dtlto-reapi serve`: it passes when a link would work (running the
//! real clang on a worker), and for an unreachable server, refused credentials, a wrong instance
//! name and a server without execution it fails at the right step with the right advice — never
//! printing a secret.

mod common;

use std::process::Output;

use common::{CredentialHelper, Server, toolchain};

const SECRET: &str = "s3cret-check-token";

/// Runs `dtlto-reapi check ARGS` (settings from the command line only: no config file is found
/// in an empty working directory with HOME pointing there too).
fn check(args: &[&str]) -> Output {
    let empty = tempfile::tempdir().unwrap();
    common::run(
        common::dtlto_reapi()
            .arg("check")
            .args(args)
            .current_dir(empty.path())
            .env("HOME", empty.path())
            .env("XDG_CONFIG_HOME", empty.path())
            .env_remove("DTLTO_REAPI_CONFIG"),
    )
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Panics unless `out` failed with a ✗ line for `step` containing `problem`, followed by advice
/// containing `advice`, and no secret anywhere.
fn assert_fails_at(out: &Output, step: &str, problem: &str, advice: &str) {
    let text = stdout(out);
    assert!(!out.status.success(), "check passed:\n{text}");
    let lines: Vec<&str> = text.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with(&format!("✗ {step}: ")))
        .unwrap_or_else(|| panic!("no ✗ {step} line:\n{text}"));
    assert!(lines[at].contains(problem), "{text}");
    assert!(
        lines[at + 1].starts_with("  → ") && lines[at + 1].contains(advice),
        "{text}"
    );
    assert_eq!(text.matches('✗').count(), 2, "one failing step:\n{text}");
    assert_no_secret(out);
}

fn assert_no_secret(out: &Output) {
    let all = format!("{}{}", stdout(out), String::from_utf8_lossy(&out.stderr));
    assert!(!all.contains(SECRET), "a secret was printed:\n{all}");
}

#[test]
fn check_passes_against_serve_and_runs_the_compiler_on_a_worker() {
    let server = Server::start(["--instance-name", "main"]);
    let clang = toolchain().clang.display().to_string();
    let remote = format!("--remote={}", server.url());
    let out = check(&[&remote, "--instance-name=main", "--compiler", &clang]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    for step in [
        "settings",
        "connection",
        "authentication",
        "capabilities",
        "CAS",
        "action cache",
        "remote execution",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(&format!("✓ {step}: "))),
            "no ✓ {step}:\n{text}"
        );
    }
    assert!(text.contains("execution enabled"), "{text}");
    assert!(text.contains("digest functions SHA256"), "{text}");
    let execution = text
        .lines()
        .find(|l| l.starts_with("✓ remote execution"))
        .unwrap();
    assert!(
        execution.contains("clang version") && execution.contains("queued"),
        "{execution}"
    );
    assert!(
        text.ends_with("a link with these settings would work\n"),
        "{text}"
    );
}

#[test]
fn check_passes_with_a_credential_helper_without_showing_its_token() {
    let server = Server::start(["--require-header", &format!("x-token={SECRET}")]);
    let helper = CredentialHelper::answering(&format!(r#"{{"x-token": ["{SECRET}"]}}"#));
    let remote = format!("--remote={}", server.url());
    let out = check(&[&remote, "--mode=cache-only", &helper.option()]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains(&format!(
            "x-token from credential helper {}",
            helper.path.display()
        )),
        "{text}"
    );
    assert_eq!(helper.runs(), 1);
    assert_no_secret(&out);
}

#[test]
fn an_unreachable_server_fails_at_the_connection() {
    // A port that was free a moment ago: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let remote = format!("--remote=grpc://127.0.0.1:{port}");
    let out = check(&[&remote]);
    assert_fails_at(
        &out,
        "connection",
        "Connection refused",
        "check that the server runs",
    );
}

#[test]
fn refused_credentials_fail_at_authentication() {
    let server = Server::start(["--require-header", "x-token=right"]);
    let remote = format!("--remote={}", server.url());
    let header = format!("--remote-header=x-token={SECRET}");
    let out = check(&[&remote, &header]);
    assert_fails_at(&out, "authentication", "UNAUTHENTICATED", "--remote-header");

    let out = check(&[&remote]);
    assert_fails_at(
        &out,
        "authentication",
        "UNAUTHENTICATED",
        "--credential-helper",
    );
}

#[test]
fn a_wrong_instance_name_fails_with_advice() {
    let server = Server::start(["--instance-name", "main"]);
    let remote = format!("--remote={}", server.url());
    let out = check(&[&remote, "--instance-name=mian"]);
    assert_fails_at(&out, "instance name", "NOT_FOUND", "--instance-name");
}

#[test]
fn a_server_without_execution_suggests_cache_only() {
    let server = Server::start(["--no-execution"]);
    let remote = format!("--remote={}", server.url());
    let out = check(&[&remote]);
    assert_fails_at(
        &out,
        "capabilities",
        "does not execute actions",
        "--mode=cache-only",
    );
    // In cache-only mode the same server is all a link needs.
    let out = check(&[&remote, "--mode=cache-only"]);
    assert!(out.status.success(), "{}", stdout(&out));
    assert!(!stdout(&out).contains("remote execution"));
}

#[test]
fn a_compiler_the_workers_cannot_run_fails_the_execution_step() {
    let server = Server::start::<[&str; 0], &str>([]);
    let remote = format!("--remote={}", server.url());
    let clang = toolchain().clang.display().to_string();
    let out = check(&[
        &remote,
        "--remote-compiler=/nonexistent/clang",
        "--compiler",
        &clang,
    ]);
    assert_fails_at(
        &out,
        "remote execution",
        "exited with 127",
        "--remote-compiler",
    );
    // A link identifies its compiler on this machine: one that is not here fails before anything
    // is sent, in either mode.
    for mode in ["--toolchain=upload", "--toolchain=worker"] {
        let out = check(&[&remote, mode, "--compiler=/nonexistent/clang"]);
        assert_fails_at(
            &out,
            "remote execution",
            "/nonexistent/clang",
            "give --compiler",
        );
    }
}

#[test]
fn check_uploads_the_compiler_to_workers_that_do_not_have_it() {
    // The workers see neither the compiler's directory nor the wrappers', as on a real cluster.
    let tools = toolchain();
    let compiler_dir = tools.compiler.parent().unwrap();
    let server = Server::start([
        "--hide".as_ref(),
        compiler_dir.as_os_str(),
        "--hide".as_ref(),
        tools.bin.as_os_str(),
    ]);
    let remote = format!("--remote={}", server.url());
    let compiler = tools.compiler.display().to_string();
    let mut args = vec![remote.as_str(), "--compiler", &compiler];
    if !tools.compiler_prepend.is_empty() {
        args.extend(["--compiler-prepend-arg", &tools.compiler_prepend]);
    }
    let out = check(&args);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("✓ remote execution: "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("clang version"), "{line}");
    assert!(line.contains("upload mode"), "{line}");
    // At its path on the workers, the same compiler cannot run.
    args.push("--toolchain=worker");
    assert_fails_at(&check(&args), "remote execution", "exited with 127", "");
}

#[test]
fn platform_properties_the_workers_do_not_offer_fail_the_execution_step() {
    let server = Server::start(["--platform", "OSFamily=linux"]);
    let clang = toolchain().clang.display().to_string();
    let remote = format!("--remote={}", server.url());
    let out = check(&[&remote, "--platform=OSFamily=windows", "--compiler", &clang]);
    assert_fails_at(
        &out,
        "remote execution",
        "no worker offers platform property OSFamily=windows",
        "check --platform",
    );
    let out = check(&[&remote, "--platform=OSFamily=linux", "--compiler", &clang]);
    assert!(out.status.success(), "{}", stdout(&out));
}
