//! Credential helpers in real links: `dtlto-reapi serve --require-header` refuses calls without
//! the right header, and helper scripts supply it — a fixed token, a token that expires mid-link,
//! a stale token replaced after UNAUTHENTICATED — or fail, hang, or print garbage. The helper's
//! runs are counted through a file it appends to, and no secret may appear in anything the
//! distributor prints or writes.

mod common;

use std::time::{Duration, Instant};

use common::{
    CredentialHelper, Linked, Project, Server, chain, chain_project, eventually, ran_only,
};

const SECRET: &str = "s3cret-token-value";

/// A server that hides `project` from actions and requires `x-token` (a value or `file:PATH`).
fn server(project: &Project, token: &str, extra: &[&str]) -> Server {
    let mut args = vec![
        "--hide".to_string(),
        project.dir().display().to_string(),
        "--require-header".to_string(),
        format!("x-token={token}"),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    Server::start(args)
}

/// Links `project` through `server` with `extra` distributor options.
fn link(project: &Project, server: &Server, output: &str, extra: &[String]) -> Linked {
    project
        .link(output)
        .remote(server.url())
        .distributor_args(extra)
        .stats_json()
        .run()
}

/// Panics if `SECRET` (or any token the helpers make) is in the link's output or statistics.
fn assert_no_secret(linked: &Linked) {
    let mut seen = format!("{}\n{}", linked.stdout, linked.stderr);
    if let Some(stats) = linked.written_stats() {
        seen.push_str(&stats.to_string());
    }
    for secret in [SECRET, "s3cret"] {
        assert!(!seen.contains(secret), "a secret was printed:\n{seen}");
    }
}

/// The distributor's own error lines in a link's stderr.
fn distributor_errors(linked: &Linked) -> Vec<&str> {
    linked
        .stderr
        .lines()
        .filter(|l| l.starts_with("dtlto-reapi: error"))
        .collect()
}

#[test]
fn a_fixed_token_helper_authenticates_once_per_link() {
    let (project, expected) = chain_project(3);
    let server = server(&project, SECRET, &[]);
    let helper = CredentialHelper::answering(&format!(r#"{{"x-token": ["{SECRET}"]}}"#));

    // Without credentials the link fails, and says which options to check.
    let refused = link(&project, &server, "none/app", &[]);
    refused.assert_failure();
    refused.assert_stderr_contains("UNAUTHENTICATED");
    refused.assert_stderr_contains("--credential-helper");

    // The pattern names the server's host: the helper is chosen for it.
    let scoped = format!("--credential-helper=127.0.0.1={}", helper.path.display());
    let linked = link(&project, &server, "helper/app", &[scoped]);
    assert_eq!(linked.run_program(), expected);
    assert_eq!(
        linked.stats().ran(),
        ran_only("remote", 4),
        "{}\n{}",
        linked.stats(),
        linked.stderr
    );
    assert_eq!(helper.runs(), 1, "the helper must run once per link");
    let port = server.url().rsplit(':').next().unwrap();
    assert_eq!(
        helper.requests().trim(),
        format!(r#"{{"uri":"grpc://127.0.0.1:{port}"}}"#)
    );
    assert_no_secret(&linked);

    // A helper for another host is not used.
    let elsewhere = format!(
        "--credential-helper=*.example.com={}",
        helper.path.display()
    );
    link(&project, &server, "other/app", &[elsewhere]).assert_failure();
    assert_eq!(helper.runs(), 1);
}

#[test]
fn the_command_line_header_wins_over_the_helper() {
    let (project, expected) = chain_project(2);
    let server = server(&project, SECRET, &[]);
    let helper = CredentialHelper::answering(r#"{"x-token": ["wrong"]}"#);
    let given = format!("--remote-header=x-token={SECRET}");
    let linked = link(&project, &server, "app", &[helper.option(), given]);
    assert_eq!(linked.run_program(), expected);
    assert_no_secret(&linked);
}

#[test]
fn a_token_that_expires_mid_link_is_fetched_again() {
    // Every run of the helper issues a new token (and the server learns it from the file); the
    // server accepts each token for 10 calls only, fewer than the link makes.
    let helper = CredentialHelper::new(
        r#"n=$(wc -l < "$D/runs")
token="tok-$n-s3cret"
printf %s "$token" > "$D/token.new" && mv "$D/token.new" "$D/token"
printf '{"headers": {"x-token": ["%s"]}, "expires": "2099-01-01T00:00:00Z"}' "$token""#,
    );
    let token_file = helper.dir().join("token");
    std::fs::write(&token_file, "nobody-yet").unwrap();
    let (project, expected) = chain_project(4);
    let server = server(
        &project,
        &format!("file:{}", token_file.display()),
        &["--fault-expire-credentials", "10"],
    );
    let linked = link(&project, &server, "app", &[helper.option()]);
    assert_eq!(linked.run_program(), expected);
    assert_eq!(
        linked.stats().ran(),
        ran_only("remote", 5),
        "{}\n{}",
        linked.stats(),
        linked.stderr
    );
    assert!(
        helper.runs() >= 2,
        "the helper ran {} time(s); expired credentials must be fetched again",
        helper.runs()
    );
    assert_no_secret(&linked);
}

#[test]
fn a_refused_token_makes_the_helper_run_once_more_and_the_call_repeat() {
    // The first answer is stale; the second is right.
    let helper = CredentialHelper::new(&format!(
        r#"if [ "$(wc -l < "$D/runs")" -eq 1 ]; then t=stale; else t={SECRET}; fi
echo "{{\"headers\": {{\"x-token\": [\"$t\"]}}}}""#
    ));
    let (project, expected) = chain_project(2);
    let server = server(&project, SECRET, &[]);
    let linked = link(&project, &server, "app", &[helper.option()]);
    assert_eq!(linked.run_program(), expected);
    assert_eq!(helper.runs(), 2);
    assert_no_secret(&linked);

    // A helper whose answer is refused every time runs twice and the link fails clearly.
    let stale = CredentialHelper::answering(r#"{"x-token": ["stale"]}"#);
    let refused = link(&project, &server, "refused/app", &[stale.option()]);
    refused.assert_failure();
    assert_eq!(stale.runs(), 2);
    assert_eq!(distributor_errors(&refused).len(), 1, "{}", refused.stderr);
    refused.assert_stderr_contains("UNAUTHENTICATED");
}

#[test]
fn a_failing_helper_is_one_clear_error_quoting_its_stderr() {
    let (project, _) = chain_project(2);
    let server = server(&project, SECRET, &[]);
    let helper = CredentialHelper::new("echo 'no login session; run login-tool' >&2\nexit 3");
    let linked = link(&project, &server, "app", &[helper.option()]);
    linked.assert_failure();
    let errors = distributor_errors(&linked);
    assert_eq!(errors.len(), 1, "{}", linked.stderr);
    let path = helper.path.display().to_string();
    assert!(
        errors[0].contains(&path) && errors[0].contains("no login session; run login-tool"),
        "{}",
        errors[0]
    );
    assert!(errors[0].contains("exit status: 3"), "{}", errors[0]);
}

#[test]
fn a_helper_printing_garbage_is_one_clear_error_without_the_garbage() {
    let (project, _) = chain_project(2);
    let server = server(&project, SECRET, &[]);
    for body in [
        format!("echo 'token: {SECRET}'"),
        format!(r#"echo '{{"headers": "{SECRET}"}}'"#),
        format!(r#"echo '{{"headers": {{"x-token": ["{SECRET}'"#),
    ] {
        let helper = CredentialHelper::new(&body);
        let linked = link(&project, &server, "app", &[helper.option()]);
        linked.assert_failure();
        let errors = distributor_errors(&linked);
        assert_eq!(errors.len(), 1, "{}", linked.stderr);
        assert!(
            errors[0].contains(&helper.path.display().to_string())
                && errors[0].contains("instead of {\"headers\""),
            "{}",
            errors[0]
        );
        assert_no_secret(&linked);
    }
}

#[test]
fn a_hanging_helper_is_killed_at_its_timeout() {
    let (project, _) = chain_project(2);
    let server = server(&project, SECRET, &[]);
    // The helper's child holds its stdout open too: the whole process group must go.
    let helper = CredentialHelper::new("sleep 60 &\necho $! > \"$D/sleeper\"\nwait");
    let started = Instant::now();
    let linked = link(
        &project,
        &server,
        "app",
        &[helper.option(), "--credential-helper-timeout=1".to_string()],
    );
    linked.assert_failure();
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    let errors = distributor_errors(&linked);
    assert_eq!(errors.len(), 1, "{}", linked.stderr);
    assert!(
        errors[0].contains("did not answer within 1s and was killed"),
        "{}",
        errors[0]
    );
    let sleeper: u32 = std::fs::read_to_string(helper.dir().join("sleeper"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // Killed: gone, or a zombie waiting for init to reap it. (A SIGKILLed process on a loaded
    // machine can take a moment to be scheduled and die.)
    let stat = || std::fs::read_to_string(format!("/proc/{sleeper}/stat")).unwrap_or_default();
    let dead = || {
        let stat = stat();
        stat.is_empty()
            || stat
                .rsplit(')')
                .next()
                .unwrap_or_default()
                .trim_start()
                .starts_with('Z')
    };
    assert!(
        eventually(Duration::from_secs(10), dead),
        "the helper's child {sleeper} outlived the timeout: {}",
        stat()
    );
}

#[test]
fn config_never_shows_secrets() {
    let helper = CredentialHelper::answering(r#"{}"#);
    let out = common::run_ok(
        common::dtlto_reapi()
            .arg("config")
            .arg(format!("--remote-header=x-token={SECRET}"))
            .arg(helper.option()),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&helper.path.display().to_string()), "{text}");
    assert!(!text.contains(SECRET), "{text}");
    assert_eq!(helper.runs(), 0, "config must not run the helper");

    // A header given without `=` is refused without being echoed, by `config` and by a link.
    let out = common::dtlto_reapi()
        .arg("config")
        .arg("--remote-header=s3cret-without-equals")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("NAME=VALUE"),
        "{stderr}"
    );
    assert!(!stderr.contains("s3cret"), "{stderr}");
    let (project, _) = chain_project(1);
    let server = server(&project, SECRET, &[]);
    let linked = link(
        &project,
        &server,
        "app",
        &["--remote-header=s3cret-without-equals".to_string()],
    );
    linked.assert_failure();
    linked.assert_stderr_contains("NAME=VALUE");
    assert_no_secret(&linked);
}

#[test]
fn a_config_file_planted_by_another_user_is_ignored_and_the_users_own_applies() {
    use std::os::unix::fs::{PermissionsExt as _, chown};
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: only root can give a file to another user (CI runs as root)");
        return;
    }
    // A shared, world-writable directory like /tmp, with another user's dtlto-reapi.toml in it,
    // and the project below it.
    let mut project = Project::in_subdir("shared/project");
    let chain = chain(2);
    project.add_sources(chain.sources);
    let shared = project.dir().parent().unwrap().to_owned();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let server = server(&project, SECRET, &[]);
    let planted_helper = CredentialHelper::answering(&format!(r#"{{"x-token": ["{SECRET}"]}}"#));
    let planted = shared.join("dtlto-reapi.toml");
    std::fs::write(
        &planted,
        format!(
            "remote = \"{}\"\ncredential-helper = [\"{}\"]\n",
            server.url(),
            planted_helper.path.display()
        ),
    )
    .unwrap();
    chown(&planted, Some(65534), Some(65534)).unwrap();

    // The user's own config: the same server, the user's own helper.
    let own_helper = CredentialHelper::answering(&format!(r#"{{"x-token": ["{SECRET}"]}}"#));
    let home = tempfile::tempdir().unwrap();
    let own = home.path().join("dtlto-reapi").join("config.toml");
    std::fs::create_dir_all(own.parent().unwrap()).unwrap();
    std::fs::write(
        &own,
        format!(
            "remote = \"{}\"\ncredential-helper = [\"{}\"]\n",
            server.url(),
            own_helper.path.display()
        ),
    )
    .unwrap();

    let linked = project
        .link("app")
        .stats_json()
        .env("XDG_CONFIG_HOME", home.path())
        .run();
    assert_eq!(linked.run_program(), chain.expected_output);
    assert_eq!(
        linked.stats().ran(),
        ran_only("remote", 3),
        "{}\n{}",
        linked.stats(),
        linked.stderr
    );
    assert_eq!(planted_helper.runs(), 0, "the planted config's helper ran");
    assert_eq!(own_helper.runs(), 1, "{}", linked.stderr);
    let warnings: Vec<&str> = linked
        .stderr
        .lines()
        .filter(|l| l.contains("warning"))
        .collect();
    assert_eq!(warnings.len(), 1, "{}", linked.stderr);
    assert!(
        warnings[0].contains(&format!("ignoring {}", planted.display()))
            && warnings[0].contains("owned by user 65534"),
        "{}",
        warnings[0]
    );

    // Named explicitly, the same file is the user's choice and is read.
    let named = common::run_ok(
        common::dtlto_reapi()
            .current_dir(project.dir())
            .env("XDG_CONFIG_HOME", home.path())
            .arg("config")
            .arg(format!("--config={}", planted.display())),
    );
    let text = String::from_utf8_lossy(&named.stdout);
    assert!(
        text.contains(&format!("# config file: {}", planted.display())),
        "{text}"
    );
    assert!(String::from_utf8_lossy(&named.stderr).is_empty());
}
