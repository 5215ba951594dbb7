//! The fault matrix: "a link survives a flaky cluster". Each test links a real C program through
//! dtlto-reapi against its own `dtlto-reapi serve`, started with one of the server's fault knobs
//! (failing RPCs, dropped Execute streams, corrupted downloads, slow answers, tiny batches) or
//! killed in the middle of the link, and checks three things: the program prints what it should,
//! its native objects are byte-identical to those of a local link of the same project, and the
//! jobs ran where the fault says they must (`--stats-json`: `remote` when retries and resumption
//! absorb the fault, `local` when the cluster is beyond saving and the local fallback finishes
//! the link with one warning). Permanent failures must fail the link, naming the reason.
//!
//! The server cannot see the project's directory (`--hide`), as on a real cluster.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use common::{Linked, Project, Server, Stats, chain_with_archive, ran_only};

/// Modules in each test's program; with `main.c` and the archived module that is four jobs.
const MODULES: usize = 3;
const JOBS: usize = MODULES + 1;

/// The text of the local fallback's warning (one line per cause, not per job).
const FALLBACK_WARNING: &str = "falling back to local compiles";

/// One test's program and what a local link of it produces.
struct Case {
    project: Project,
    expected_output: String,
    /// The local link's native objects, sorted by content (their names carry lld's PID).
    local_objects: Vec<Vec<u8>>,
}

impl Case {
    /// The chain program, its last module in a static archive, names with spaces and parentheses
    /// ([`chain_with_archive`]); linked locally once for reference.
    fn new() -> Case {
        let (project, expected_output) = chain_with_archive(MODULES);
        let local = project.link("local/app").save_temps().run();
        assert_eq!(local.run_program(), expected_output);
        let local_objects = local.native_object_contents();
        assert_eq!(local_objects.len(), JOBS, "{:?}", local.native_objects());
        Case {
            project,
            expected_output,
            local_objects,
        }
    }

    /// A server with `faults` whose actions cannot see the project.
    fn server(&self, faults: &[&str]) -> Server {
        let mut args = vec![
            "--hide".to_owned(),
            self.project.dir().display().to_string(),
        ];
        args.extend(faults.iter().map(|s| (*s).to_owned()));
        Server::start(args)
    }

    /// Links through `url` into `output`'s directory with `extra` distributor options; does not
    /// judge the result.
    fn link(&self, url: &str, output: &str, extra: &[&str]) -> Remote {
        let link = self
            .project
            .link(output)
            .remote(url)
            .distributor_args(extra)
            .stats_json()
            .save_temps();
        let started = Instant::now();
        let linked = link.run();
        let elapsed = started.elapsed();
        eprintln!(
            "link {output}: {elapsed:.2?}, {}\n{}",
            linked.status, linked.stderr
        );
        Remote {
            stats: linked.written_stats(),
            linked,
            elapsed,
        }
    }

    /// Asserts that `remote` linked the right program from objects identical to the local link's.
    fn assert_correct(&self, remote: &Remote) {
        assert_eq!(
            remote.linked.run_program(),
            self.expected_output,
            "{}",
            remote.linked.stderr
        );
        assert!(
            remote.linked.native_object_contents() == self.local_objects,
            "the native objects differ from the local link's\n{}",
            remote.linked.stderr
        );
    }
}

/// A link through a faulty server.
struct Remote {
    linked: Linked,
    /// The `--stats-json` file, when the distributor got far enough to write it.
    stats: Option<Stats>,
    elapsed: Duration,
}

impl Remote {
    /// The link failed, saying each of `texts`, and no job was left to the local fallback.
    fn assert_failed_without_fallback(&self, texts: &[&str]) {
        self.linked.assert_failure();
        for text in texts {
            self.linked.assert_stderr_contains(text);
        }
        assert!(
            self.fallback_warnings().is_empty(),
            "{}",
            self.linked.stderr
        );
        assert!(!self.ran().contains_key("local"), "{}", self.stats());
    }

    fn stats(&self) -> &Stats {
        self.stats
            .as_ref()
            .unwrap_or_else(|| panic!("the link wrote no --stats-json\n{}", self.linked.stderr))
    }

    /// How many jobs ran where (`remote`, `action-cache`, `local`).
    fn ran(&self) -> BTreeMap<String, usize> {
        self.stats().ran()
    }

    /// RPC attempts the client repeated after transient failures.
    fn rpc_retries(&self) -> u64 {
        self.stats().transfers("rpc_retries")
    }

    /// The stderr lines announcing the local fallback.
    fn fallback_warnings(&self) -> Vec<&str> {
        self.linked
            .stderr
            .lines()
            .filter(|l| l.contains(FALLBACK_WARNING))
            .collect()
    }

    /// Asserts that every job ran in `place`.
    fn assert_all_ran(&self, place: &str) {
        assert_eq!(
            self.ran(),
            ran_only(place, JOBS),
            "{}\n{}",
            self.stats(),
            self.linked.stderr
        );
    }

    /// Asserts that every job fell back to a local compile, announced by exactly one warning
    /// that mentions `cause`.
    fn assert_fell_back(&self, cause: &str) {
        self.assert_all_ran("local");
        let warnings = self.fallback_warnings();
        assert_eq!(warnings.len(), 1, "{}", self.linked.stderr);
        assert!(warnings[0].contains(cause), "{}", self.linked.stderr);
    }
}

/// Links a new [`Case`] through a server with `faults` and checks that the fault was absorbed: the
/// link is correct and every job ran remotely. Returns the link for further checks.
fn link_absorbing(faults: &[&str]) -> Remote {
    let case = Case::new();
    let server = case.server(faults);
    let remote = case.link(server.url(), "out/app", &[]);
    case.assert_correct(&remote);
    remote.assert_all_ran("remote");
    remote
}

/// Links a new [`Case`] through a server with `faults`, with `extra` distributor options, and
/// checks that the link is correct although every job fell back to a local compile, announced by
/// one warning that mentions `cause`. Returns the link for further checks.
fn link_falling_back(faults: &[&str], extra: &[&str], cause: &str) -> Remote {
    let case = Case::new();
    let server = case.server(faults);
    let remote = case.link(server.url(), "out/app", extra);
    case.assert_correct(&remote);
    remote.assert_fell_back(cause);
    remote
}

#[test]
fn unavailable_executes_are_retried() {
    let remote = link_absorbing(&["--fault-fail=Execute=UNAVAILABLE:3"]);
    assert!(remote.rpc_retries() >= 3, "{}", remote.stats());
    assert!(
        remote.fallback_warnings().is_empty(),
        "{}",
        remote.linked.stderr
    );
}

#[test]
fn dropped_execute_streams_are_resumed_and_forgotten_operations_executed_again() {
    let case = Case::new();
    // Resumed with WaitExecution.
    let server = case.server(&["--fault-drop-execute-stream=2"]);
    let remote = case.link(server.url(), "resumed/app", &[]);
    case.assert_correct(&remote);
    remote.assert_all_ran("remote");
    assert!(remote.rpc_retries() >= 2, "{}", remote.stats());

    // The server no longer knows the operations: executed again. The first execution went on
    // after its stream broke, so the second may find its result in the action cache.
    let server = case.server(&[
        "--fault-drop-execute-stream=2",
        "--fault-fail=WaitExecution=NOT_FOUND:2",
    ]);
    let remote = case.link(server.url(), "again/app", &[]);
    case.assert_correct(&remote);
    let ran = remote.ran();
    assert_eq!(
        ran.get("remote").unwrap_or(&0) + ran.get("action-cache").unwrap_or(&0),
        JOBS,
        "{}",
        remote.stats()
    );
    // Two broken streams, two operations not found.
    assert!(remote.rpc_retries() >= 4, "{}", remote.stats());
}

/// Every RPC of the servers killed mid-link takes this long, so that the link is still talking
/// to the server when it dies.
const SLOW_RPC_MS: u64 = 1000;

/// Kills `server` once lld has handed the jobs to the distributor (the job file `--save-temps`
/// keeps appears beside `output`) and `after` more has passed: past the connection
/// (GetCapabilities takes [`SLOW_RPC_MS`]) and long before any job can have finished remotely.
fn kill_mid_link(server: Server, output: &Path, after: Duration) -> thread::JoinHandle<()> {
    let dir = output.parent().map(Path::to_path_buf).unwrap_or_default();
    thread::spawn(move || {
        let started = Instant::now();
        let distributing = || {
            fs::read_dir(&dir).is_ok_and(|entries| {
                entries
                    .flatten()
                    .any(|e| e.file_name().to_string_lossy().ends_with(".dist-file.json"))
            })
        };
        while !distributing() {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "lld never wrote its job file into {}",
                dir.display()
            );
            thread::sleep(Duration::from_millis(10));
        }
        thread::sleep(after);
        eprintln!(
            "killing the server {:.2?} after the link started",
            started.elapsed()
        );
        drop(server);
    })
}

/// Links `case` through a slow server that is killed mid-link; returns the link and the server's
/// address.
fn link_while_the_server_dies(case: &Case, output: &str, extra: &[&str]) -> (Remote, String) {
    let server = case.server(&[&format!("--fault-delay-ms={SLOW_RPC_MS}")]);
    let url = server.url().to_owned();
    let killer = kill_mid_link(
        server,
        &case.project.dir().join(output),
        Duration::from_millis(SLOW_RPC_MS * 2),
    );
    let remote = case.link(&url, output, extra);
    killer.join().expect("the killer thread panicked");
    (remote, url)
}

#[test]
fn a_server_killed_mid_link_leaves_the_link_to_the_local_fallback() {
    let case = Case::new();
    let (remote, url) = link_while_the_server_dies(&case, "out/app", &["--remote-retries=3"]);
    case.assert_correct(&remote);
    remote.assert_fell_back(&url);
}

#[test]
fn without_fallback_a_server_killed_mid_link_fails_the_link_with_the_reason() {
    let case = Case::new();
    let (remote, url) = link_while_the_server_dies(
        &case,
        "out/app",
        &["--remote-retries=3", "--local-fallback=false"],
    );
    remote.linked.assert_failure();
    let stderr = &remote.linked.stderr;
    assert!(remote.fallback_warnings().is_empty(), "{stderr}");
    // The reason names the server and the gRPC failure.
    assert!(
        stderr.contains(&url) && stderr.contains("failed with"),
        "{stderr}"
    );
    assert!(
        !remote.ran().contains_key("local"),
        "{}\n{stderr}",
        remote.stats()
    );
}

#[test]
fn a_corrupted_download_is_read_again() {
    // Had a corrupt blob been accepted, the objects would differ from the local link's; had it
    // not been read again, the job would have run locally. The first read is an output inlined in
    // an Execute response (then downloaded instead), the second a download (then read again).
    link_absorbing(&["--fault-corrupt-reads=2"]);
}

#[test]
fn inputs_lost_from_the_cas_before_execution_are_uploaded_again() {
    // The first two executions find their input files gone (as if evicted after the upload) and
    // are answered FAILED_PRECONDITION naming them: had the client not sent them again (although
    // it had uploaded them itself), those jobs would have run locally.
    link_absorbing(&["--fault-lose-inputs=2"]);
}

#[test]
fn blobs_a_batch_upload_refuses_are_sent_again() {
    // The server answers the first three blobs of its BatchUpdateBlobs calls with a per-blob
    // UNAVAILABLE and does not store them: had the client not sent those blobs again, their jobs'
    // executions would have missed inputs, and those jobs would have run locally.
    let remote = link_absorbing(&["--fault-refuse-blobs=3"]);
    assert!(remote.rpc_retries() >= 1, "{}", remote.stats());
}

#[test]
fn persistent_corruption_is_an_infrastructure_failure() {
    link_falling_back(&["--fault-corrupt-reads=1000000"], &[], "corrupt");
}

/// A server that takes 1.5 s to answer anything, against a 1 s deadline per call.
const SLOWER_THAN_THE_DEADLINE: [&str; 2] = ["--fault-delay-ms=1500", "--remote-timeout=1"];

#[test]
fn a_server_slower_than_the_deadline_leaves_the_link_to_the_local_fallback() {
    let remote = link_falling_back(
        &SLOWER_THAN_THE_DEADLINE[..1],
        &SLOWER_THAN_THE_DEADLINE[1..],
        "DEADLINE_EXCEEDED",
    );
    eprintln!(
        "a link against a server slower than the deadline took {:.2?}",
        remote.elapsed
    );
}

#[test]
fn without_fallback_a_server_slower_than_the_deadline_fails_the_link_in_bounded_time() {
    let case = Case::new();
    let server = case.server(&SLOWER_THAN_THE_DEADLINE[..1]);
    let remote = case.link(
        server.url(),
        "out/app",
        &[SLOWER_THAN_THE_DEADLINE[1], "--local-fallback=false"],
    );
    eprintln!(
        "a link against a server slower than the deadline failed after {:.2?}",
        remote.elapsed
    );
    remote.linked.assert_failure();
    let stderr = &remote.linked.stderr;
    assert!(
        stderr.contains(server.url()) && stderr.contains("DEADLINE_EXCEEDED"),
        "{stderr}"
    );
    // Generous: a deadline that is not enforced would hang the link for minutes.
    assert!(remote.elapsed < Duration::from_secs(30), "{stderr}");
}

#[test]
fn tiny_batch_limit() {
    link_absorbing(&["--max-batch-bytes=1024"]);
}

#[test]
fn permission_denied_is_not_retried_and_fails_the_link() {
    let case = Case::new();
    let server = case.server(&["--fault-fail=GetActionResult=PERMISSION_DENIED:100"]);
    let remote = case.link(server.url(), "out/app", &[]);
    remote.assert_failed_without_fallback(&["PERMISSION_DENIED"]);
    assert_eq!(remote.rpc_retries(), 0, "{}", remote.stats());
}

#[test]
fn a_worker_without_the_compiler_leaves_the_link_to_the_local_fallback() {
    link_falling_back(
        &[],
        &["--remote-compiler=/nonexistent/clang"],
        "cannot run the compiler",
    );
}

/// The peak resident memory (VmHWM) of the distributor processes working in a directory, sampled
/// from `/proc` every 20 ms while a link runs.
struct PeakRss {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    watcher: thread::JoinHandle<Option<u64>>,
}

impl PeakRss {
    fn watch(dir: &Path) -> PeakRss {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let (dir, exe) = (
            dir.canonicalize().unwrap(),
            common::distributor().canonicalize().unwrap(),
        );
        let flag = stop.clone();
        let watcher = thread::spawn(move || {
            let mut peak = None;
            while !flag.load(Ordering::Relaxed) {
                for entry in fs::read_dir("/proc").unwrap().flatten() {
                    let proc = entry.path();
                    let ours = fs::read_link(proc.join("exe")).is_ok_and(|e| e == exe)
                        && fs::read_link(proc.join("cwd")).is_ok_and(|c| c == dir);
                    let hwm_kib = || -> Option<u64> {
                        let status = fs::read_to_string(proc.join("status")).ok()?;
                        let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
                        line.split_whitespace().nth(1)?.parse().ok()
                    };
                    if let Some(kib) = ours.then(hwm_kib).flatten() {
                        peak = Some(peak.unwrap_or(0).max(kib * 1024));
                    }
                }
                thread::sleep(Duration::from_millis(20));
            }
            peak
        });
        PeakRss { stop, watcher }
    }

    /// The peak in bytes; panics when no distributor was ever seen (the test could not judge).
    fn finish(self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.watcher
            .join()
            .unwrap()
            .expect("the distributor was never seen running")
    }
}

/// What a hostile server may cost the distributor in memory, at most.
const MEMORY_BOUND: u64 = 200 << 20;

/// Links a new [`Case`] through a hostile server with `faults` (and `extra` distributor options),
/// checking that the program is right, that the link ended within `limit`, and that the
/// distributor's memory stayed bounded.
fn link_against_hostile(faults: &[&str], extra: &[&str], limit: Duration) -> (Case, Remote) {
    let case = Case::new();
    let server = case.server(faults);
    let peak = PeakRss::watch(case.project.dir());
    let remote = case.link(server.url(), "out/app", extra);
    let peak = peak.finish();
    eprintln!("the distributor's peak RSS: {} MiB", peak >> 20);
    case.assert_correct(&remote);
    assert!(
        remote.elapsed < limit,
        "took {:?}\n{}",
        remote.elapsed,
        remote.linked.stderr
    );
    assert!(
        peak < MEMORY_BOUND,
        "peak RSS {} MiB\n{}",
        peak >> 20,
        remote.linked.stderr
    );
    (case, remote)
}

/// Objects go through ByteStream (not batches), and a call may wait 2 s.
const READS_BY_STREAM: [&str; 1] = ["--max-batch-bytes=1024"];
const SHORT_TIMEOUT: [&str; 1] = ["--remote-timeout=2"];

#[test]
fn a_read_that_stalls_ends_in_the_local_fallback() {
    let faults = [READS_BY_STREAM[0], "--fault-reads=stall"];
    let (_, remote) = link_against_hostile(&faults, &SHORT_TIMEOUT, Duration::from_secs(60));
    remote.assert_fell_back("DEADLINE_EXCEEDED");
}

#[test]
fn a_read_that_drips_a_byte_a_second_ends_in_the_local_fallback() {
    let faults = [READS_BY_STREAM[0], "--fault-reads=drip"];
    let (_, remote) = link_against_hostile(&faults, &SHORT_TIMEOUT, Duration::from_secs(60));
    remote.assert_fell_back("DEADLINE_EXCEEDED");
}

#[test]
fn a_zstd_bomb_in_a_read_is_a_clear_error_and_memory_stays_bounded() {
    // Every compressed read answers 128 KiB that decompress to 4 GiB. Only objects of 1 KiB and
    // more travel compressed: their jobs fall back to local compiles.
    let faults = [READS_BY_STREAM[0], "--fault-zstd-bomb"];
    // `on`: the server is on this machine, where `auto` would not compress.
    let compress = ["--remote-compression=on"];
    let (_, remote) = link_against_hostile(&faults, &compress, Duration::from_secs(120));
    let warnings = remote.fallback_warnings();
    assert_eq!(warnings.len(), 1, "{}", remote.linked.stderr);
    assert!(
        warnings[0].contains("cannot decompress the zstd stream: decompresses to more than the"),
        "{}",
        warnings[0]
    );
    assert!(remote.ran().get("local") >= Some(&1), "{}", remote.stats());
}

#[test]
fn an_output_claiming_a_terabyte_is_a_server_error_and_falls_back() {
    let (_, remote) = link_against_hostile(
        &["--fault-output-size=1099511627776"],
        &[],
        Duration::from_secs(60),
    );
    remote.assert_fell_back("more than the 4 GiB limit");
}

#[test]
fn a_gigabyte_of_compiler_output_is_shown_truncated() {
    let (_, remote) = link_against_hostile(
        &["--fault-stderr-size=1073741824"],
        &[],
        Duration::from_secs(60),
    );
    remote.assert_all_ran("remote");
    let notes = remote
        .linked
        .stderr
        .matches("more bytes of the compiler's output not shown")
        .count();
    assert_eq!(notes, JOBS, "one truncated output per job");
    assert!(
        remote.linked.stderr.len() < JOBS * (80 << 10),
        "{} bytes of stderr",
        remote.linked.stderr.len()
    );
}

#[test]
fn remote_execute_timeout_bounds_the_wait_for_an_execution() {
    // Every Execute takes 30 s to answer; the link waits 2 s for each, whatever --remote-timeout.
    let (_, remote) = link_against_hostile(
        &["--fault-slow=Execute=30000"],
        &["--remote-execute-timeout=2", "--remote-timeout=60"],
        Duration::from_secs(25),
    );
    remote.assert_fell_back("DEADLINE_EXCEEDED");
}

#[test]
fn verbose_logs_show_retries_with_their_code_and_delay_and_the_execution_stages() {
    let case = Case::new();
    let server = case.server(&["--fault-fail=Execute=UNAVAILABLE:1"]);
    let remote = case.link(server.url(), "out/app", &["--verbose"]);
    case.assert_correct(&remote);
    let stderr = &remote.linked.stderr;
    let retry = stderr
        .lines()
        .find(|l| l.contains("retrying a remote call"))
        .unwrap_or_else(|| panic!("no retry event\n{stderr}"));
    // The server's RetryInfo asks for 50 ms.
    assert!(
        retry.contains("code=Unavailable") && retry.contains("delay_ms=50"),
        "{retry}"
    );
    assert!(
        stderr.contains("remote execution stage") && stderr.contains("stage=Executing"),
        "{stderr}"
    );
}

#[test]
fn logs_show_why_jobs_fell_back() {
    let case = Case::new();
    let server = case.server(&["--fault-output-size=1099511627776"]);
    let remote = case.link(server.url(), "out/app", &["--verbose"]);
    case.assert_correct(&remote);
    let events = remote
        .linked
        .stderr
        .lines()
        .filter(|l| l.contains("remote execution failed; compiling locally"))
        .count();
    // One event per job (the user-facing warning is once per cause).
    assert_eq!(events, JOBS, "{}", remote.linked.stderr);
}

#[test]
fn a_server_that_says_it_cannot_find_the_compiler_leaves_the_link_to_the_local_fallback() {
    // As a third-party server answered a missing compiler: a NOT_FOUND ExecuteResponse status
    // (the action never ran), not an exit code.
    let remote = link_falling_back(
        &["--missing-program-status=NOT_FOUND"],
        &["--remote-compiler=/nonexistent/clang"],
        "could not find or run the program",
    );
    remote.linked.assert_stderr_contains("NOT_FOUND");
}

#[test]
fn any_status_that_says_the_action_did_not_run_leaves_the_link_to_the_local_fallback() {
    link_falling_back(
        &["--fault-execute-status=FAILED_PRECONDITION:the worker lost its sandbox"],
        &[],
        "the worker lost its sandbox",
    );
}

#[test]
fn an_execute_status_about_credentials_fails_the_link_with_advice() {
    let case = Case::new();
    let server = case.server(&["--fault-execute-status=PERMISSION_DENIED:no executions for you"]);
    let remote = case.link(server.url(), "out/app", &[]);
    remote.assert_failed_without_fallback(&["no executions for you", "check --remote-header"]);
}

#[test]
fn executions_that_keep_failing_with_a_transient_status_are_retried_a_bounded_number_of_times() {
    // Every execution done with INTERNAL: retried (it may be a passing glitch), then left to the
    // local fallback, instead of being executed again and again until the hour-long Execute
    // deadline.
    let remote = link_falling_back(
        &["--fault-execute-status=INTERNAL:the worker lost its sandbox"],
        &[],
        "the worker lost its sandbox",
    );
    assert!(remote.rpc_retries() >= JOBS as u64, "{}", remote.stats());
    assert!(
        remote.elapsed < Duration::from_secs(60),
        "{:?}",
        remote.elapsed
    );
}
