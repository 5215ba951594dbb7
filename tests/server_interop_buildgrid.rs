//! Interop: BuildGrid's `bgd` command line (`buildgrid==0.4.4` from PyPI, installed by
//! `scripts/buildgrid.sh`), a third-party REAPI client, reads the capabilities of
//! `dtlto-reapi serve`, uploads a file and downloads it back, and runs a command whose output
//! file it fetches. The test fails, never skips, when BuildGrid cannot be installed.

mod support_server;
mod tools;

use std::path::Path;
use support_server::{Server, digest};
use tokio::process::Command;

/// Runs `bgd --remote URL <args>` in `dir`; returns stdout and stderr, asserting success.
async fn run(bgd: &Path, dir: &Path, group: &str, url: &str, args: &[&str]) -> String {
    let output = Command::new(bgd)
        .arg(group)
        .args(["--remote", url])
        .args(args)
        .current_dir(dir)
        .output()
        .await
        .expect("run bgd");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "bgd {group} {args:?} failed:\n{text}"
    );
    text
}

#[tokio::test]
async fn buildgrid_bgd_talks_to_serve() {
    let bgd = tools::bgd();
    let server = Server::start(&[]).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let dir = dir.path();

    let capabilities = run(bgd, dir, "capabilities", &server.http_url(), &[]).await;
    assert!(capabilities.contains("\"SHA256\""), "{capabilities}");
    assert!(
        capabilities.contains("\"execEnabled\": true"),
        "{capabilities}"
    );

    let contents = b"uploaded by bgd\n";
    std::fs::write(dir.join("up.txt"), contents).expect("write");
    let d = digest(contents);
    let uploaded = run(
        bgd,
        dir,
        "cas",
        &server.http_url(),
        &["upload-file", "--verify", "up.txt"],
    )
    .await;
    assert!(uploaded.contains(&d.hash), "{uploaded}");
    assert_eq!(
        server.read(&d).await,
        contents,
        "the server holds what bgd uploaded"
    );
    let wanted = format!("{}/{}", d.hash, d.size_bytes);
    run(
        bgd,
        dir,
        "cas",
        &server.http_url(),
        &["download-file", "--verify", &wanted, "down.txt"],
    )
    .await;
    assert_eq!(
        std::fs::read(dir.join("down.txt")).expect("downloaded"),
        contents
    );

    std::fs::create_dir(dir.join("input")).expect("mkdir");
    std::fs::write(dir.join("input/in.txt"), b"abc\n").expect("write");
    // `--` keeps bgd from reading the command's own `-c` as one of its options.
    let script = "tr a-z A-Z < in.txt > out.txt";
    run(
        bgd,
        dir,
        "execute",
        &server.http_url(),
        &[
            "command",
            "--output-file",
            "out.txt",
            "--output-directory",
            "fetched",
            "input",
            "--",
            "/bin/sh",
            "-c",
            script,
        ],
    )
    .await;
    assert_eq!(
        std::fs::read(dir.join("fetched/out.txt")).expect("output fetched by bgd"),
        b"ABC\n"
    );
}
