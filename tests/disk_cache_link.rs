//! The disk cache in real links: a relink is served from `--disk-cache` in every mode, links running
//! at the same time share it safely, and it is consulted before the cluster.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::{Linked, Project, Server, chain, chain_project, chain_with_archive, ran_only};

/// Links `project` with the disk cache in `cache` plus `extra` options; returns the link and how
/// many jobs ran where.
fn link(
    project: &Project,
    output: &str,
    cache: &Path,
    extra: &[String],
) -> (Linked, BTreeMap<String, usize>) {
    let linked = project
        .link(output)
        .distributor_arg(format!("--disk-cache={}", cache.display()))
        .distributor_args(extra)
        .stats_json()
        .save_temps()
        .run();
    linked.assert_success();
    let ran = linked.stats().ran();
    (linked, ran)
}

#[test]
fn a_local_relink_comes_from_the_disk_cache() {
    let (project, expected) = chain_with_archive(3);
    let cache = tempfile::tempdir().expect("tempdir");
    let (first, ran) = link(&project, "one/app", cache.path(), &[]);
    assert_eq!(first.run_program(), expected);
    assert_eq!(ran, ran_only("local", 4));
    let (second, ran) = link(&project, "two/app", cache.path(), &[]);
    assert_eq!(second.run_program(), expected);
    assert_eq!(ran, ran_only("disk-cache", 4));
    assert_eq!(
        first.native_object_contents(),
        second.native_object_contents()
    );
    second.assert_stderr_contains("4 disk-cache hits");
}

#[test]
fn concurrent_links_share_one_disk_cache() {
    let (project, expected) = chain_with_archive(3);
    let cache = tempfile::tempdir().expect("tempdir");
    std::thread::scope(|scope| {
        let links: Vec<_> = (0..3)
            .map(|i| {
                let (project, cache) = (&project, cache.path());
                scope.spawn(move || link(project, &format!("par{i}/app"), cache, &[]))
            })
            .collect();
        for handle in links {
            let (linked, _) = handle.join().expect("link thread");
            assert_eq!(linked.run_program(), expected);
        }
    });
    let (last, ran) = link(&project, "after/app", cache.path(), &[]);
    assert_eq!(last.run_program(), expected);
    assert_eq!(ran, ran_only("disk-cache", 4));
}

#[test]
fn the_disk_cache_is_consulted_before_the_cluster_and_filled_from_it() {
    let (project, expected) = chain_with_archive(3);
    let server = Server::start(["--hide".to_owned(), project.dir().display().to_string()]);
    let remote = [format!("--remote={}", server.url())];
    let cache = tempfile::tempdir().expect("tempdir");
    let (first, ran) = link(&project, "one/app", cache.path(), &remote);
    assert_eq!(first.run_program(), expected);
    assert_eq!(ran, ran_only("remote", 4));
    let (second, ran) = link(&project, "two/app", cache.path(), &remote);
    assert_eq!(second.run_program(), expected);
    assert_eq!(ran, ran_only("disk-cache", 4));

    // The same Actions as local mode: what a remote link put in the disk cache serves a local one.
    let (third, ran) = link(&project, "three/app", cache.path(), &[]);
    assert_eq!(third.run_program(), expected);
    assert_eq!(ran, ran_only("disk-cache", 4));
}

#[test]
fn a_damaged_disk_cache_never_yields_a_wrong_object() {
    let (project, expected) = chain_with_archive(3);
    let cache = tempfile::tempdir().expect("tempdir");
    let (first, _) = link(&project, "one/app", cache.path(), &[]);
    // Flip a byte in every stored blob: each hit must be detected as corrupt and recompiled.
    for shard in std::fs::read_dir(cache.path().join("cas")).expect("cas") {
        for blob in std::fs::read_dir(shard.expect("entry").path()).expect("shard") {
            let path = blob.expect("blob").path();
            let mut bytes = std::fs::read(&path).expect("read");
            if let Some(b) = bytes.first_mut() {
                *b ^= 0xff;
                std::fs::write(&path, &bytes).expect("write");
            }
        }
    }
    let (second, ran) = link(&project, "two/app", cache.path(), &[]);
    assert_eq!(second.run_program(), expected);
    assert_eq!(ran, ran_only("local", 4));
    assert_eq!(
        first.native_object_contents(),
        second.native_object_contents()
    );
}

#[test]
fn a_cache_directory_others_can_write_is_refused_and_the_link_goes_on() {
    use std::os::unix::fs::PermissionsExt as _;
    let (project, expected) = chain_with_archive(3);
    let cache = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(cache.path(), std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let (linked, ran) = link(&project, "one/app", cache.path(), &[]);
    assert_eq!(linked.run_program(), expected);
    assert_eq!(ran, ran_only("local", 4));
    let warnings: Vec<&str> = linked
        .stderr
        .lines()
        .filter(|l| l.contains("writable by group or others"))
        .collect();
    assert_eq!(warnings.len(), 1, "{}", linked.stderr);
    assert_eq!(
        std::fs::read_dir(cache.path()).expect("list").count(),
        0,
        "nothing is written into a refused cache"
    );
}

#[test]
fn symlinks_planted_in_the_cache_are_never_followed() {
    let (project, expected) = chain_with_archive(3);
    let cache = tempfile::tempdir().expect("tempdir");
    let (first, _) = link(&project, "one/app", cache.path(), &[]);
    let victims = tempfile::tempdir().expect("tempdir");
    let victim_file = victims.path().join("precious.txt");
    std::fs::write(&victim_file, b"precious").expect("write");
    let victim_dir = victims.path().join("precious-dir");
    std::fs::create_dir(&victim_dir).expect("mkdir");
    // The size total and every blob shard now lead out of the cache.
    let size = cache.path().join("size");
    let _ = std::fs::remove_file(&size);
    std::os::unix::fs::symlink(&victim_file, &size).expect("plant size");
    let mut planted = 0;
    for shard in std::fs::read_dir(cache.path().join("cas")).expect("list cas") {
        let shard = shard.expect("entry").path();
        std::fs::remove_dir_all(&shard).expect("rm shard");
        std::os::unix::fs::symlink(&victim_dir, &shard).expect("plant shard");
        planted += 1;
    }
    assert!(planted > 0);

    let (second, ran) = link(&project, "two/app", cache.path(), &[]);
    assert_eq!(second.run_program(), expected);
    assert_eq!(ran, ran_only("local", 4), "{}", second.stderr);
    assert_eq!(std::fs::read(&victim_file).expect("read"), b"precious");
    assert_eq!(std::fs::read_dir(&victim_dir).expect("list").count(), 0);
    assert_eq!(
        first.native_object_contents(),
        second.native_object_contents()
    );
    // The cache repaired itself: the next link is served from it.
    let (_, ran) = link(&project, "three/app", cache.path(), &[]);
    assert_eq!(ran, ran_only("disk-cache", 4));
}

/// A link of `project` to `output` with the digest cache under `xdg_cache` and the disk cache in
/// `disk_cache`, writing `--stats-json`.
fn caching_link<'a>(
    project: &'a Project,
    output: &str,
    xdg_cache: &Path,
    disk_cache: &Path,
) -> common::Link<'a> {
    project
        .link(output)
        .env("XDG_CACHE_HOME", xdg_cache)
        .distributor_arg(format!("--disk-cache={}", disk_cache.display()))
        .stats_json()
}

/// The sizes of `files` (relative to `project`'s directory), summed.
fn total_size<'a>(project: &Project, files: impl IntoIterator<Item = &'a Path>) -> u64 {
    files
        .into_iter()
        .map(|f| {
            std::fs::metadata(project.dir().join(f))
                .expect("input")
                .len()
        })
        .sum()
}

#[test]
fn a_relink_takes_unchanged_inputs_from_the_digest_cache_and_sees_changed_ones() {
    let (project, expected) = chain_project(3);
    let objects: Vec<&Path> = project.inputs().iter().map(|p| p.as_path()).collect();
    let xdg_cache = tempfile::tempdir().expect("tempdir");
    let disk_cache = tempfile::tempdir().expect("tempdir");
    let relink = |output: &str| {
        let linked = caching_link(&project, output, xdg_cache.path(), disk_cache.path())
            .save_temps()
            .run();
        linked.assert_success();
        let shards: Vec<String> = linked.jobs()["jobs"]
            .as_array()
            .expect("jobs")
            .iter()
            .map(|job| job["inputs"][1].as_str().expect("shard").to_owned())
            .collect();
        let shard_bytes = total_size(&project, shards.iter().map(Path::new));
        (linked, shards.len() as u64, shard_bytes)
    };
    // A damaged digest cache (in another format version's words: every part) is an empty one,
    // and the parts a link adds to are replaced (damaged lines under this version's header are
    // skipped: the unit tests).
    let digest_cache = xdg_cache.path().join("dtlto-reapi/file-digests-v4");
    for part in 0..=255 {
        common::write(
            &digest_cache.join(format!("{part:02x}")),
            b"dtlto-reapi digest cache v3\n1 2 3 \xff\n\x00 truncated",
        );
    }
    // Files changed within the last two seconds are never remembered: let the objects age.
    std::thread::sleep(std::time::Duration::from_millis(2100));
    let (first, _, _) = relink("one/app");
    assert_eq!(first.run_program(), expected);
    let stats = first.stats();
    assert_eq!(stats.inputs("files_from_digest_cache"), 0, "{stats}");
    let jobs = first.jobs()["jobs"].as_array().expect("jobs").len() as u64;
    assert_eq!(stats.inputs("shards_rewritten"), jobs, "{stats}");
    assert_eq!(
        stats.inputs("shard_rewrites_from_digest_cache"),
        0,
        "{stats}"
    );
    let parts: Vec<String> = std::fs::read_dir(&digest_cache)
        .expect("digest cache")
        .map(|part| {
            String::from_utf8_lossy(&std::fs::read(part.expect("part").path()).expect("part"))
                .into_owned()
        })
        .collect();
    assert_eq!(parts.len(), 256);
    let saved = parts
        .iter()
        .find(|part| part.lines().any(|line| line.ends_with(" mod0.o")))
        .expect("a part remembers mod0.o");
    assert!(!saved.contains("truncated"), "{saved}");

    // Unchanged objects are taken from the digest cache, not read; only the index shards lld
    // wrote afresh for this link are hashed.
    let (second, jobs, shard_bytes) = relink("two/app");
    assert_eq!(second.run_program(), expected);
    let stats = second.stats();
    // The same Actions as the first link's: the remembered module hashes matched the shards.
    assert_eq!(
        stats.ran(),
        ran_only("disk-cache", jobs as usize),
        "{stats}"
    );
    assert_eq!(
        stats.inputs("files_from_digest_cache"),
        objects.len() as u64,
        "{stats}"
    );
    let object_bytes = total_size(&project, objects.iter().copied());
    assert_eq!(
        stats.inputs("bytes_from_digest_cache"),
        object_bytes,
        "{stats}"
    );
    assert_eq!(stats.inputs("files_hashed"), jobs, "{stats}");
    assert_eq!(stats.inputs("bytes_hashed"), shard_bytes, "{stats}");
    // Nor are the shards rewritten: the rewrites' digests are remembered too.
    assert_eq!(stats.inputs("shards_rewritten"), 0, "{stats}");
    assert_eq!(
        stats.inputs("shard_rewrites_from_digest_cache"),
        jobs,
        "{stats}"
    );

    // A copy of the build directory elsewhere (new paths and inodes: every object is hashed
    // again) names the same modules, so it finds the rewrites made here.
    let copy = project.copy_elsewhere();
    let elsewhere = caching_link(&copy, "four/app", xdg_cache.path(), disk_cache.path()).run();
    elsewhere.assert_success();
    assert_eq!(elsewhere.run_program(), expected);
    let stats = elsewhere.stats();
    assert_eq!(
        stats.ran(),
        ran_only("disk-cache", jobs as usize),
        "{stats}"
    );
    assert_eq!(stats.inputs("files_from_digest_cache"), 0, "{stats}");
    assert_eq!(stats.inputs("shards_rewritten"), 0, "{stats}");
    assert_eq!(
        stats.inputs("shard_rewrites_from_digest_cache"),
        jobs,
        "{stats}"
    );

    // An object rewritten with the same size and its modification time set back is read again
    // (its status-change time moved), and the link uses its new content.
    let changed = project.dir().join("mod2.o");
    let old = std::fs::metadata(&changed).expect("mod2.o");
    // The same module doubling by 4 instead of 2, compiled from a name of the same length.
    let code = chain(3).sources.remove(2).1.replace("2 * x", "4 * x");
    let variant = project.compile("mod9.c", &code);
    let new_content = std::fs::read(project.dir().join(variant)).expect("variant");
    assert_eq!(
        new_content.len() as u64,
        old.len(),
        "the variant must keep the size"
    );
    std::fs::write(&changed, &new_content).expect("rewrite mod2.o");
    let file = std::fs::File::options()
        .write(true)
        .open(&changed)
        .expect("mod2.o");
    file.set_modified(old.modified().expect("mtime"))
        .expect("set mtime back");
    drop(file);
    let after = std::fs::metadata(&changed).expect("mod2.o");
    assert_eq!(
        (after.len(), after.modified().ok()),
        (old.len(), old.modified().ok())
    );
    let (third, jobs, shard_bytes) = relink("three/app");
    assert_ne!(third.run_program(), expected);
    let stats = third.stats();
    assert_eq!(stats.inputs("files_hashed"), jobs + 1, "{stats}");
    assert_eq!(
        stats.inputs("bytes_hashed"),
        shard_bytes + old.len(),
        "{stats}"
    );
    assert_eq!(
        stats.inputs("files_from_digest_cache"),
        objects.len() as u64 - 1,
        "{stats}"
    );
}

/// A link listing more input files than a relink does (over 64) hashes them on the blocking pool,
/// the compiler's files beside them; what it learns is kept all the same.
#[test]
fn a_link_of_many_inputs_hashes_them_on_the_pool_and_remembers_them() {
    let (project, expected) = chain_project(30);
    let xdg_cache = tempfile::tempdir().expect("tempdir");
    let disk_cache = tempfile::tempdir().expect("tempdir");
    // Files changed within the last two seconds are never remembered: let the objects age.
    std::thread::sleep(std::time::Duration::from_millis(2100));
    let first = caching_link(&project, "one/app", xdg_cache.path(), disk_cache.path())
        .save_temps()
        .run();
    first.assert_success();
    assert_eq!(first.run_program(), expected);
    let jobs = first.jobs();
    let listed: usize = (jobs["jobs"].as_array().expect("jobs").iter())
        .map(|job| job["inputs"].as_array().expect("inputs").len())
        .sum();
    // More than a relink's 64 (`planner.rs`), so that this link took the pool's path.
    assert!(listed > 64, "{listed} input files listed: {jobs}");
    assert_eq!(first.stats().inputs("files_from_digest_cache"), 0);

    let second = caching_link(&project, "two/app", xdg_cache.path(), disk_cache.path()).run();
    second.assert_success();
    assert_eq!(second.run_program(), expected);
    let stats = second.stats();
    assert_eq!(stats.ran(), ran_only("disk-cache", 31), "{stats}");
    assert_eq!(
        stats.inputs("files_from_digest_cache"),
        project.inputs().len() as u64,
        "{stats}"
    );
}

/// A digest cache whose part files another user could write is neither read nor written: the
/// link hashes its inputs, warns once, and its objects are right.
#[cfg(unix)]
#[test]
fn a_digest_cache_others_could_write_is_not_used() {
    use std::os::unix::fs::PermissionsExt as _;

    let (project, expected) = chain_project(3);
    let xdg_cache = tempfile::tempdir().expect("tempdir");
    let disk_cache = tempfile::tempdir().expect("tempdir");
    let digest_cache = xdg_cache.path().join("dtlto-reapi/file-digests-v4");
    std::fs::create_dir_all(&digest_cache).expect("digest cache");
    std::fs::set_permissions(&digest_cache, std::fs::Permissions::from_mode(0o700))
        .expect("chmod the directory");
    // Every part, so that whichever a link reads first (for an input, the compiler or a rewritten
    // shard) is writable by others.
    let header = b"dtlto-reapi digest cache v4\n";
    for part in 0..=255 {
        let path = digest_cache.join(format!("{part:02x}"));
        common::write(&path, header);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))
            .expect("chmod a part");
    }
    std::thread::sleep(std::time::Duration::from_millis(2100));
    for output in ["one/app", "two/app"] {
        let linked = caching_link(&project, output, xdg_cache.path(), disk_cache.path()).run();
        linked.assert_success();
        assert_eq!(linked.run_program(), expected);
        linked.assert_stderr_contains("is writable by group or others");
        assert_eq!(
            linked.stderr.matches("so it is not used").count(),
            1,
            "one warning:\n{}",
            linked.stderr
        );
        let stats = linked.stats();
        assert_eq!(stats.inputs("files_from_digest_cache"), 0, "{stats}");
    }
    for part in std::fs::read_dir(&digest_cache).expect("digest cache") {
        let path = part.expect("part").path();
        assert_eq!(
            std::fs::read(&path).expect("part"),
            header,
            "{}",
            path.display()
        );
    }
}
