//! The disk cache as concurrent links use it: several OS processes (this test binary run again in
//! a child mode, two threads each) look up, store and fetch the same and different entries in one
//! directory at once, with and without eviction going on. Every hit any of them gets must be
//! intact, and so must every entry left afterwards. Also: a cache directory full of garbage reads
//! as misses, is cleaned, and keeps working.

use std::fs::{self, File, FileTimes};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant, SystemTime};

use bazel_remote_apis::build::bazel::remote::execution::v2::OutputFile;
use dtlto_reapi::cache::{DEFAULT_MAX_BYTES, DiskCache};
use dtlto_reapi::reapi::{ActionResult, Digest, digest};

/// Set in a child process: the cache directory; the child's worker number, the cache bound and
/// the number of rounds come in the variables after it.
const CHILD_DIR: &str = "DTLTO_DISK_CACHE_TEST_DIR";
const CHILD_WORKER: &str = "DTLTO_DISK_CACHE_TEST_WORKER";
const CHILD_MAX: &str = "DTLTO_DISK_CACHE_TEST_MAX";
const CHILD_ROUNDS: &str = "DTLTO_DISK_CACHE_TEST_ROUNDS";

const WORKERS: usize = 4;
const THREADS: usize = 2;
/// Entries every worker uses, and entries each worker has to itself.
const SHARED: usize = 32;
const OWN: usize = 16;

/// One cache entry: an action whose result names one output blob.
struct Entry {
    name: String,
    content: Vec<u8>,
}

impl Entry {
    fn shared(i: usize) -> Entry {
        Entry::new(format!("shared-{i}"))
    }

    fn own(worker: usize, i: usize) -> Entry {
        Entry::new(format!("worker-{worker}-{i}"))
    }

    /// Sizes from 1 KB to about 30 KB, content derived from the name.
    fn new(name: String) -> Entry {
        let seed = digest::of_bytes(name.as_bytes()).hash.into_bytes();
        let len = 1000 + seed.iter().map(|&b| b as usize).sum::<usize>() * 4;
        let content = (0..len)
            .map(|k| seed[k % seed.len()] ^ (k / 64) as u8)
            .collect();
        Entry { name, content }
    }

    fn action(&self) -> Digest {
        digest::of_bytes(format!("action {}", self.name).as_bytes())
    }

    fn result(&self, blob: Digest) -> ActionResult {
        ActionResult {
            output_files: vec![OutputFile {
                path: format!("{}.o", self.name),
                digest: Some(blob),
                ..Default::default()
            }],
            ..Default::default()
        }
    }
}

/// What a lookup found.
#[derive(Debug, PartialEq)]
enum Lookup {
    /// The action result and its blob, checked against the entry.
    Hit,
    /// No result, or its blob went away before it was copied.
    Miss,
}

/// Looks `entry` up as the executor would (result, then its blob copied to `dest`) and panics on
/// anything but an intact hit or a miss.
fn lookup(cache: &DiskCache, entry: &Entry, dest: &Path) -> Lookup {
    let Some(result) = cache.get_action_result(&entry.action()).expect("get") else {
        return Lookup::Miss;
    };
    let [file] = result.output_files.as_slice() else {
        panic!(
            "{}: result has {} outputs",
            entry.name,
            result.output_files.len()
        );
    };
    assert_eq!(
        file.path,
        format!("{}.o", entry.name),
        "result of another action"
    );
    let blob = file.digest.as_ref().expect("output digest");
    if !cache.fetch_blob(blob, dest).expect("fetch") {
        assert!(!dest.exists(), "a failed fetch leaves no file");
        return Lookup::Miss;
    }
    let fetched = fs::read(dest).expect("read fetched output");
    assert!(
        fetched == entry.content,
        "{}: fetched output differs",
        entry.name
    );
    fs::remove_file(dest).expect("remove fetched output");
    Lookup::Hit
}

/// Stores `entry` as the executor does after a compile: the output from a file, then the result.
fn store(cache: &DiskCache, entry: &Entry, scratch: &Path) {
    fs::write(scratch, &entry.content).expect("write output");
    let blob = cache.store_file(scratch).expect("store output");
    assert_eq!(blob, digest::of_bytes(&entry.content));
    cache
        .put_action_result(&entry.action(), &entry.result(blob))
        .expect("put result");
}

/// A child process: waits for the parent's go, then each thread works through the shared entries
/// and the worker's own ones, storing on a miss, for several rounds.
#[test]
#[ignore = "child process of the concurrency tests"]
fn child_worker() {
    let dir = PathBuf::from(std::env::var_os(CHILD_DIR).expect("run by a concurrency test"));
    let worker: usize = env_number(CHILD_WORKER);
    let max_bytes: u64 = env_number(CHILD_MAX);
    let rounds: usize = env_number(CHILD_ROUNDS);
    let cache = DiskCache::open(&dir, max_bytes).expect("open");
    let go = dir.join("go");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !go.exists() {
        assert!(Instant::now() < deadline, "no go from the parent");
        std::thread::sleep(Duration::from_millis(5));
    }
    let scratch = tempfile::tempdir().expect("scratch dir");
    std::thread::scope(|s| {
        for thread in 0..THREADS {
            let (cache, scratch) = (&cache, scratch.path());
            s.spawn(move || {
                let dest = scratch.join(format!("fetched-{thread}"));
                let output = scratch.join(format!("output-{thread}"));
                for round in 0..rounds {
                    // In the first round every thread walks the entries in the same order, so
                    // they all miss, store and read the same entry at once; later rounds start
                    // at different points, so that each also meets entries others just stored.
                    let start = round * (worker * THREADS + thread + 1);
                    let entries = (0..SHARED)
                        .map(|i| Entry::shared((start + i) % SHARED))
                        .chain((0..OWN).map(|i| Entry::own(worker, (start + i) % OWN)));
                    for entry in entries {
                        if lookup(cache, &entry, &dest) == Lookup::Miss {
                            store(cache, &entry, &output);
                        }
                    }
                }
            });
        }
    });
    cache.trim().expect("trim");
}

fn env_number<T: std::str::FromStr>(name: &str) -> T {
    let value = std::env::var(name).unwrap_or_else(|_| panic!("{name} not set"));
    value
        .parse()
        .unwrap_or_else(|_| panic!("{name}={value} is not a number"))
}

/// Runs the workers against one cache bounded to `max_bytes` and waits for them all to succeed.
/// A worker's output goes to a log, shown only if it fails.
fn run_workers(dir: &Path, max_bytes: u64, rounds: usize) {
    let exe = std::env::current_exe().expect("test binary");
    let logs = tempfile::tempdir().expect("log dir");
    let log = |worker: usize| logs.path().join(format!("worker-{worker}.log"));
    let mut children: Vec<Child> = (0..WORKERS)
        .map(|worker| {
            let out = File::create(log(worker)).expect("create log");
            let err = out.try_clone().expect("clone log");
            Command::new(&exe)
                .args(["child_worker", "--exact", "--ignored", "--nocapture"])
                .env(CHILD_DIR, dir)
                .env(CHILD_WORKER, worker.to_string())
                .env(CHILD_MAX, max_bytes.to_string())
                .env(CHILD_ROUNDS, rounds.to_string())
                .stdout(out)
                .stderr(err)
                .spawn()
                .expect("spawn a worker")
        })
        .collect();
    File::create(dir.join("go")).expect("say go");
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut failures = Vec::new();
    for (worker, child) in children.iter_mut().enumerate() {
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait") {
                break Some(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        match status {
            Some(status) if status.success() => {}
            other => failures.push(format!(
                "worker {worker} ended with {other:?}:\n{}",
                fs::read_to_string(log(worker)).unwrap_or_default()
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn all_entries() -> Vec<Entry> {
    (0..SHARED)
        .map(Entry::shared)
        .chain((0..WORKERS).flat_map(|w| (0..OWN).map(move |i| Entry::own(w, i))))
        .collect()
}

/// Bytes in the entry directories, and the number of files left in `tmp/`.
fn disk_usage(dir: &Path) -> (u64, usize) {
    let mut bytes = 0;
    for namespace in ["cas", "ac"] {
        for shard in fs::read_dir(dir.join(namespace)).expect("list") {
            for file in fs::read_dir(shard.expect("shard").path()).expect("list shard") {
                bytes += file.expect("entry").metadata().expect("stat").len();
            }
        }
    }
    let temps = fs::read_dir(dir.join("tmp")).expect("list tmp").count();
    (bytes, temps)
}

fn recorded_total(dir: &Path) -> u64 {
    let text = fs::read_to_string(dir.join("size")).expect("size file");
    text.parse().expect("size file holds a number")
}

#[test]
fn concurrent_processes_leave_every_entry_intact() {
    let dir = tempfile::tempdir().expect("tempdir");
    run_workers(dir.path(), DEFAULT_MAX_BYTES, 2);

    let cache = DiskCache::open(dir.path(), DEFAULT_MAX_BYTES).expect("open");
    let dest = dir.path().join("fetched");
    for entry in all_entries() {
        assert_eq!(lookup(&cache, &entry, &dest), Lookup::Hit, "{}", entry.name);
    }
    let (bytes, temps) = disk_usage(dir.path());
    assert_eq!(temps, 0, "temporary files left behind");
    // Two workers storing the same new blob may both count it, so the total can be high, never low.
    let recorded = recorded_total(dir.path());
    assert!(recorded >= bytes, "recorded {recorded} < {bytes} on disk");
}

#[test]
fn concurrent_processes_under_eviction_get_intact_hits_or_misses() {
    let everything: u64 = all_entries().iter().map(|e| e.content.len() as u64).sum();
    // About a quarter of what the workers store fits: eviction runs all the time.
    let max_bytes = everything / 4;
    let dir = tempfile::tempdir().expect("tempdir");
    // Many rounds: every miss rewrites an entry while others read, evict and rewrite it.
    run_workers(dir.path(), max_bytes, 10);

    // Every worker checked each of its hits; now check what is left, undisturbed.
    let cache = DiskCache::open(dir.path(), max_bytes).expect("open");
    let dest = dir.path().join("fetched");
    let hits = all_entries()
        .iter()
        .filter(|entry| lookup(&cache, entry, &dest) == Lookup::Hit)
        .count();
    assert!(
        (1..all_entries().len()).contains(&hits),
        "{hits} entries left: eviction should keep some and drop others"
    );
    let (bytes, temps) = disk_usage(dir.path());
    assert_eq!(temps, 0, "temporary files left behind");
    // The shared total may miss an action result replaced as it was evicted (a few hundred
    // bytes), nothing more.
    let slack = max_bytes / 16;
    assert!(
        bytes <= max_bytes + slack,
        "{bytes} bytes on disk, bound {max_bytes}"
    );
}

#[test]
fn a_corrupt_cache_directory_reads_as_misses_and_is_cleaned() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    let entry_path = |namespace: &str, d: &Digest| {
        let path = root.join(namespace).join(&d.hash[..2]).join(&d.hash);
        fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        path
    };
    // A blob whose content does not match its name, one of the wrong size, and results naming them.
    let flipped = Entry::shared(0);
    let flipped_blob = digest::of_bytes(&flipped.content);
    let mut bad = flipped.content.clone();
    bad[0] ^= 1;
    fs::write(entry_path("cas", &flipped_blob), &bad).expect("write");
    let short = Entry::shared(1);
    let short_blob = digest::of_bytes(&short.content);
    fs::write(entry_path("cas", &short_blob), &short.content[1..]).expect("write");
    for (entry, blob) in [(&flipped, &flipped_blob), (&short, &short_blob)] {
        let bytes = prost::Message::encode_to_vec(&entry.result(blob.clone()));
        fs::write(entry_path("ac", &entry.action()), bytes).expect("write");
    }
    // A result that is not a protobuf message.
    let garbage = Entry::shared(2);
    fs::write(entry_path("ac", &garbage.action()), b"\xff\xff\xff\xff").expect("write");
    // Junk in and around the layout, a dead writer's temporary file, a garbled total.
    let junk = root.join("cas").join("ab").join("notes.txt");
    fs::create_dir_all(junk.parent().expect("parent")).expect("mkdir");
    fs::write(&junk, b"junk").expect("write");
    fs::write(
        root.join("cas").join("cd"),
        b"a file where a directory belongs",
    )
    .expect("write");
    fs::create_dir_all(root.join("tmp")).expect("mkdir");
    let stale = root.join("tmp").join(".tmp-dead");
    fs::write(&stale, b"half").expect("write");
    let old = SystemTime::now() - Duration::from_secs(7200);
    File::options()
        .write(true)
        .open(&stale)
        .and_then(|f| f.set_times(FileTimes::new().set_modified(old)))
        .expect("age the temp file");
    fs::write(root.join("size"), "lots").expect("write");

    let cache = DiskCache::open(root, DEFAULT_MAX_BYTES).expect("open a damaged cache");
    assert!(!junk.exists(), "junk in the layout is removed");
    assert!(!stale.exists(), "the dead writer's file is removed");
    let dest = root.join("fetched");
    for entry in [&flipped, &short, &garbage] {
        assert_eq!(lookup(&cache, entry, &dest), Lookup::Miss, "{}", entry.name);
    }
    assert!(!cache.fetch_blob(&flipped_blob, &dest).expect("fetch"));
    assert!(
        !entry_path("cas", &flipped_blob).exists(),
        "corrupt blob removed"
    );
    assert!(
        !entry_path("cas", &short_blob).exists(),
        "wrong-size blob removed"
    );
    assert!(
        !entry_path("ac", &garbage.action()).exists(),
        "garbage result removed"
    );

    // The cache works again once the outputs are stored.
    let scratch = root.join("scratch");
    for entry in [&flipped, &short, &garbage] {
        store(&cache, entry, &scratch);
        assert_eq!(lookup(&cache, entry, &dest), Lookup::Hit, "{}", entry.name);
    }
}
