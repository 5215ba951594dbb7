//! A full disk: a compile that cannot write its object fails the link with a message naming the
//! job and the cause, and leaves no partial output behind — in local mode, and when a download
//! from the cluster cannot be written.
//!
//! Each case runs dtlto-reapi inside its own mount namespace (`unshare`, as root or through a user
//! namespace) with a 64 KiB tmpfs over the output directory, so the rest of the machine never
//! fills up.

mod common;

use std::path::Path;
use std::process::{Output, Stdio};

use serde_json::json;

/// Runs `dtlto-reapi ARGS` in `dir` with a 64 KiB tmpfs mounted over `dir/out`, and lists what is
/// left in `dir/out` afterwards (inside the namespace, before the tmpfs goes away).
fn run_on_full_disk(dir: &Path, args: &[String]) -> (Output, String) {
    let out = dir.join("out");
    std::fs::create_dir_all(&out).expect("out dir");
    let script = r#"mount -t tmpfs -o size=64k none "$1" || exit 99
shift
out=$1; shift
"$@"; status=$?
ls -A "$out" >&2
echo "left: $(ls -A "$out" | wc -l)" >&2
exit $status"#;
    let mut cmd = common::isolated("unshare");
    // As root a mount namespace is enough; otherwise a user namespace grants the mount.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        cmd.args(["--user", "--map-root-user"]);
    }
    let output = cmd
        .args(["--mount", "sh", "-c", script, "sh"])
        .arg(&out)
        .arg(&out)
        .arg(common::distributor())
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("run unshare");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_ne!(
        output.status.code(),
        Some(99),
        "cannot mount a tmpfs: {stderr}"
    );
    (output, stderr)
}

/// A job file in `dir` whose "compiler" writes a 1 MiB object to its `-o` path, as a real one
/// would, and fails when the write does; its output goes to `out/`.
fn big_output_job(dir: &Path) -> String {
    let compiler = dir.join("big compiler.sh");
    std::fs::write(
        &compiler,
        "#!/bin/sh\nwhile [ \"$1\" != -o ]; do shift; done\nhead -c 1048576 /dev/zero > \"$2\"\n",
    )
    .expect("write compiler");
    std::fs::set_permissions(
        &compiler,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    for name in ["m.o", "m.bc"] {
        std::fs::write(dir.join(name), b"x").expect("input");
    }
    let job_file = dir.join("app.1.dist-file.json");
    let jobs = json!({"common": {"linker_output": "app", "args": [compiler]},
        "jobs": [{"args": ["m.o", "-o", "out/m.native.o"], "inputs": ["m.o", "m.bc"],
                  "outputs": ["out/m.native.o"]}]});
    std::fs::write(&job_file, jobs.to_string()).expect("job file");
    job_file.display().to_string()
}

/// The job failed for lack of space, said so naming the job, and left nothing in `out/`.
fn assert_failed_cleanly((output, stderr): (Output, String)) {
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("No space left on device"), "{stderr}");
    assert!(
        stderr.contains("dtlto-reapi: error: job 0 (m.o)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("left: 0"),
        "partial output left behind: {stderr}"
    );
}

#[test]
fn a_compile_that_fills_the_disk_fails_cleanly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let job_file = big_output_job(dir.path());
    assert_failed_cleanly(run_on_full_disk(dir.path(), &[job_file]));
}

#[test]
fn a_download_that_fills_the_disk_fails_cleanly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let job_file = big_output_job(dir.path());
    // The server runs outside the namespace: its worker has room for the object, the client not.
    let server = common::Server::start(Vec::<String>::new());
    let args = [
        format!("--remote={}", server.url()),
        "--local-fallback=false".to_owned(),
        job_file,
    ];
    assert_failed_cleanly(run_on_full_disk(dir.path(), &args));
}
